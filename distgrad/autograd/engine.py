"""The local backward engine: iterative, dependency-counted, with PyTorch's hook order.

Gradients travel as NumPy arrays unless ``create_graph=True``, when they are
Tensors and every VJP records its own graph. Nodes run in decreasing sequence
number among those that are ready (PyTorch's CPU ready-queue order); leaves run as
soon as they are ready.
"""
import heapq
import sys
import threading
from itertools import count

import numpy as np

from .backward_checks import check_output_count, conform, make_root_grads
from .backward_hooks import call_post_hooks, call_pre_hooks, call_tensor_pre_hooks, has_pre_hooks
from .grad_mode import _state, thread_state
from .node import AccumulateGrad, accumulate_into_grad, sum_grads
from . import profiling
from .tensor import TensorBase, _make

_getrefcount = sys.getrefcount

__all__ = ["backward", "grad", "run_backward", "GraphTask", "make_root_grads", "execute",
           "current_graph_task", "as_tuple", "task_extension", "set_task_extension"]


class _CurrentTasks(threading.local):
    def __init__(self):
        self.stack = []


# The GraphTask each thread is executing (a hook may start a nested backward).
_current_tasks = _CurrentTasks()


def current_graph_task():
    """The GraphTask running on this thread, or None outside backward."""
    stack = _current_tasks.stack
    return stack[-1] if stack else None


def execute(task):
    """Run ``task`` until no node is ready, as this thread's current graph task (hooks see it
    through :func:`current_graph_task`)."""
    _current_tasks.stack.append(task)
    try:
        task.execute()
    finally:
        _current_tasks.stack.pop()


def will_engine_execute_node(node):
    """Whether the running backward will call ``node`` (or capture a gradient at it).

    PyTorch's ``torch._C._will_engine_execute_node``: used by multi-grad hooks to know
    how many of their tensors will see a gradient in this pass.
    """
    task = current_graph_task()
    if task is None:
        raise RuntimeError("_will_engine_execute_node should only be called during the backward "
                           "pass")
    nodes = getattr(task, "graph_nodes", None)
    if nodes is not None and node not in nodes:
        return False
    if task.exec_needed is None:
        return True
    return node in task.exec_needed or bool(task.captures and node in task.captures)


def task_extension(task, name):
    """The state kept on backward pass ``task`` under ``name`` by what is built on this
    engine (None without one, or without a pass): code that runs inside backward finds
    the distributed engine's pass with ``task_extension(current_graph_task(),
    "distributed")``."""
    return task.extensions.get(name) if task is not None else None


def set_task_extension(task, name, state):
    task.extensions[name] = state


def as_tuple(x):
    """The tensors (or values) ``x`` names, as a tuple: () for None, one for a tensor or any
    value that cannot be iterated, the items of a list, tuple or other iterable."""
    if x is None:
        return ()
    if isinstance(x, TensorBase) or not hasattr(x, "__iter__"):
        return (x,)
    return tuple(x)


def backward(tensors, grad_tensors=None, retain_graph=None, create_graph=False,
             grad_variables=None, inputs=None):
    """Compute the sum of gradients of ``tensors`` w.r.t. graph leaves, into their ``.grad``."""
    if grad_variables is not None:
        grad_tensors = grad_variables
    tensors = as_tuple(tensors)
    if inputs is not None:
        inputs = as_tuple(inputs)
        if len(inputs) == 0:
            raise RuntimeError("'inputs' argument to backward() cannot be empty.")
    grad_tensors = as_tuple(grad_tensors) if grad_tensors is not None else (None,) * len(tensors)
    if len(grad_tensors) != len(tensors):
        raise RuntimeError(f"got {len(grad_tensors)} tensors and {len(tensors)} gradients")
    if retain_graph is None:
        retain_graph = create_graph
    grads = make_root_grads(tensors, grad_tensors, create_graph)
    run_backward(tensors, grads, retain_graph, create_graph, inputs or (), allow_unused=True,
                 accumulate_grad=True)


def grad(outputs, inputs, grad_outputs=None, retain_graph=None, create_graph=False,
         only_inputs=True, allow_unused=None, is_grads_batched=False, materialize_grads=False):
    """Return the gradients of ``outputs`` w.r.t. ``inputs`` without touching ``.grad``.

    >>> import distgrad
    >>> x = distgrad.tensor(3.0, requires_grad=True)
    >>> (dx,) = distgrad.autograd.grad(x ** 2, x, create_graph=True)
    >>> distgrad.autograd.grad(dx, x)[0].item()
    2.0
    """
    if is_grads_batched:
        raise NotImplementedError("is_grads_batched=True is not supported by distgrad")
    if materialize_grads and allow_unused is False:
        raise ValueError("Expected allow_unused to be True or not passed when materialize_grads=True, "
                         "but got: allow_unused=False.")
    if allow_unused is None:
        allow_unused = materialize_grads
    outputs = as_tuple(outputs)
    inputs = as_tuple(inputs)
    grad_outputs = as_tuple(grad_outputs) if grad_outputs is not None else (None,) * len(outputs)
    if len(grad_outputs) != len(outputs):
        raise RuntimeError(f"grad requires one grad_output per output: got {len(grad_outputs)} "
                           f"grad_outputs and {len(outputs)} outputs")
    if retain_graph is None:
        retain_graph = create_graph
    grads = make_root_grads(outputs, grad_outputs, create_graph)
    result = run_backward(outputs, grads, retain_graph, create_graph, inputs,
                          allow_unused=allow_unused, accumulate_grad=False)
    if materialize_grads:
        result = tuple(r if r is not None else _make(np.zeros_like(i._data))
                       for r, i in zip(result, inputs))
    return result


class GraphTask:
    """The state of one backward pass: dependencies, input buffers and what to capture.

    The distributed engine drives a GraphTask from several entry points (the
    coordinator's roots, and gradients that arrive for send nodes), so buffers and
    dependency counts are kept here rather than in locals of one function.
    """

    def __init__(self, retain_graph, create_graph, accumulate=None):
        self.retain_graph = retain_graph
        self.create_graph = create_graph
        self.dependencies = {}
        self.buffers = {}
        self.exec_needed = None      # None: run everything; else the set of nodes to run
        self.captures = None         # node -> [(input_nr, result_index)]
        self.captured = None
        # How a leaf's gradient is stored; distributed contexts substitute their own. Their
        # passes run nodes in the order gradients arrive from other processes, so a leaf's
        # contributions are kept apart and summed in forward order (the producers' sequence
        # numbers) once all are in: the same sum, bit for bit, whatever the timing.
        self.accumulate = accumulate
        self.leaf_parts = {} if accumulate is not None else None
        self.inline_leaves = accumulate is None  # and no inputs= (init_to_execute)
        self._shared = set()  # ids of gradients seen shared by two leaves (copied by both)
        # ids of the buffers of the caller's gradients (``gradient=``): a leaf's first
        # gradient that is a contiguous view of one (a reshape's, a view's) becomes .grad
        # without a copy, sharing the caller's memory, as in PyTorch.
        self.caller_buffers = ()
        # State of what is built on this engine, by name: the distributed engine keeps its
        # pass under "distributed" (a recv node, DDP's hooks find it there), checkpointing
        # its recomputation under "checkpoint"; see task_extension.
        self.extensions = {}
        # Where linear nodes leave their weights' gradients for later (a
        # deferred_weight_grads.WeightGradStore), or None: computed as the pass runs. A
        # part of a distributed backward keeps one and flushes it when the part ends.
        self.weight_grads = None
        self._heap = []
        self._tiebreak = count()

    # -- graph discovery --
    def compute_dependencies(self, root_nodes):
        deps = self.dependencies
        seen = set(root_nodes)
        self.graph_nodes = seen  # grows below; read by will_engine_execute_node
        stack = list(seen)
        while stack:
            for nxt, _ in stack.pop()._next:
                if nxt is None:
                    continue
                if nxt in deps:
                    deps[nxt] += 1
                    continue
                deps[nxt] = 1
                if nxt not in seen:  # (a root may be reached from another root)
                    seen.add(nxt)
                    stack.append(nxt)
        return seen

    def init_to_execute(self, nodes, targets, accumulate_grad):
        """Mark which nodes must run so that gradients reach ``targets`` (PyTorch's exec_info)."""
        target_nodes = {node for node, _ in targets}
        # Children before parents: reverse of a Kahn topological order over `nodes`.
        deps = {n: 0 for n in nodes}
        for n in nodes:
            for nxt, _ in n._next:
                if nxt is not None and nxt in deps:
                    deps[nxt] += 1
        order = [n for n in nodes if deps[n] == 0]
        i = 0
        while i < len(order):
            for nxt, _ in order[i]._next:
                if nxt is not None:
                    deps[nxt] -= 1
                    if deps[nxt] == 0:
                        order.append(nxt)
            i += 1
        needed = set()
        for n in reversed(order):
            if accumulate_grad and n in target_nodes:
                needed.add(n)
                continue
            for nxt, _ in n._next:
                if nxt is not None and (nxt in needed or nxt in target_nodes):
                    needed.add(n)
                    break
        self.exec_needed = needed
        self.inline_leaves = False  # leaves are captured or skipped there: keep them in the loop
        if not accumulate_grad:
            self.captures = {}
            for index, (node, input_nr) in enumerate(targets):
                self.captures.setdefault(node, []).append((input_nr, index))
            self.captured = [None] * len(targets)

    # -- feeding gradients --
    def add_gradient(self, node, input_nr, g):
        """Add one incoming gradient for ``node`` at ``input_nr``; no dependency bookkeeping."""
        buf = self.buffers.get(node)
        if buf is None:
            buf = self.buffers[node] = [None] * len(node._out_meta or (None,))
        if g is None:
            return
        buf[input_nr] = sum_grads(buf[input_nr], g)

    def mark_ready(self, node):
        heapq.heappush(self._heap, (-node._seq, next(self._tiebreak), node))

    def has_ready_nodes(self):
        return bool(self._heap)

    def peek_ready(self):
        """The node that runs next, when called from a node's ``apply`` (whose own outputs
        are not pushed yet), or None: the distributed engine ships a wave of gradients for
        one peer as one message while the next node is another recv node."""
        return self._heap[0][2] if self._heap else None

    # -- execution --
    def execute(self):
        """Run every ready node until none is left.

        Per node: its input gradients, whether it runs at all (``inputs=``), its pre-hooks,
        the node and its post-hooks (:meth:`_run`), then where its outputs go and which
        node runs next (:meth:`_route`). Hooks live in ``backward_hooks.py``, the checks of
        gradients in ``backward_checks.py``.
        """
        # VJP rules divide by zero where PyTorch does (sqrt'(0) = inf) and stay silent as it
        # does: one errstate for the pass, since one per node would cost more than the node.
        rec = profiling.current()  # None unless this thread is profiled: one check per pass
        with thread_state(_state, grad_enabled=self.create_graph), \
                np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            node = self._pop_ready()
            while node is not None:
                grads = self.buffers.pop(node, None) or [None] * len(node._out_meta or (None,))
                if self.exec_needed is not None and not self._instrument(node, grads):
                    node = self._pop_ready()
                    continue
                if has_pre_hooks(node):
                    grads = call_pre_hooks(node, grads)
                if rec is not None:
                    node = self._profiled_step(rec, node, grads)
                    continue
                # The outputs go straight to _route, which then holds their only reference:
                # a gradient it hands to a leaf can become .grad without a copy.
                node = self._route(node, self._run(node, grads))

    def _profiled_step(self, rec, node, grads):
        """One node as :meth:`execute` runs it, with PyTorch's two events per node
        (``evaluate_function: <name>`` around it and its routing, ``<name>`` around it), and
        the same two for each hook-free leaf it makes ready, after it, as PyTorch runs
        leaves as nodes of their own (here they are accumulated inline, see _route)."""
        # (shapes before _run: an accumulator takes its gradient)
        shapes = rec.shapes_of(grads) if rec.record_shapes else None
        begin = rec.mark()
        outputs = self._run(node, grads)
        ran = rec.mark()
        leaves = []
        nxt = self._route(node, outputs, leaves)
        end = rec.node_ran(node.name(), node._seq, begin, ran, shapes)
        outputs = None  # (a leaf takes over a gradient only this frame's list refers to)
        if leaves:
            self._accumulate_leaves(leaves, rec, end)
        return nxt

    def _run(self, node, grads):
        """``node``'s input gradients for ``grads``, after its post-hooks; its saved tensors
        are freed unless the graph is retained."""
        if type(node) is AccumulateGrad:
            outputs = self._accumulate(node, grads)
        elif grads[0] is not None or any(g is not None for g in grads) or \
                getattr(node, "_materialize_grads", False):
            outputs = node.apply(grads)
            if len(outputs) != len(node._next):
                check_output_count(node, outputs)
        else:
            outputs = (None,) * len(node._next)
        if not self.retain_graph:
            node._release()
        if node._post_hooks:
            outputs = call_post_hooks(node, outputs, grads)
        return outputs

    def _route(self, node, outputs, ready_out=None):
        """Add ``outputs`` into the buffers of the nodes they feed and return the node to
        run next, or None. Hook-free leaves made ready are accumulated here, or added to
        ``ready_out`` (as ``(leaf, gradient)``) for the caller to accumulate.

        The order is PyTorch's CPU ready queue: the highest sequence number first, leaves
        (the highest of all) as soon as they are ready. So a hook-free leaf made ready here
        accumulates at once, and the best node made ready here skips the heap when nothing
        queued outranks it (in a chain, every node).
        """
        buffers, deps, leaf_parts = self.buffers, self.dependencies, self.leaf_parts
        create_graph, inline_leaves = self.create_graph, self.inline_leaves
        best = ready_leaves = None
        for (nxt, input_nr), g in zip(node._next, outputs):
            if nxt is None:
                continue
            if g is not None:
                shape, dtype = nxt._out_meta[input_nr]
                if create_graph or type(g) is not np.ndarray or g.shape != shape or \
                        g.dtype != dtype:
                    g = conform(node, nxt, input_nr, g, create_graph)
            remaining = deps[nxt] - 1
            deps[nxt] = remaining
            if inline_leaves and type(nxt) is AccumulateGrad and _is_plain_leaf(nxt):
                # A hook-free leaf: no queue; its last gradient in goes to .grad below.
                earlier = buffers.pop(nxt, None)
                if earlier is not None:
                    g = sum_grads(earlier[0], g)
                if remaining:
                    buffers[nxt] = [g]
                elif g is not None:
                    if ready_leaves is None:
                        ready_leaves = []
                    ready_leaves.append((nxt, g))
                continue
            buf = buffers.get(nxt)
            if buf is None:
                buf = buffers[nxt] = [None] * len(nxt._out_meta)
            if g is not None:
                if leaf_parts is not None and type(nxt) is AccumulateGrad:
                    leaf_parts.setdefault(nxt, []).append((node._seq, g))
                else:
                    old = buf[input_nr]
                    buf[input_nr] = g if old is None else sum_grads(old, g)
            if remaining:
                continue
            if leaf_parts is not None and nxt in leaf_parts:
                buf[0] = _in_forward_order(leaf_parts.pop(nxt))
            if best is None:
                best = nxt
            else:
                self.mark_ready(nxt)
        if ready_leaves:
            # Without this frame's references to the outputs, a gradient only the list
            # refers to is a fresh buffer that .grad may take over (PyTorch steals it the
            # same way, by use count).
            outputs = buf = g = None
            if ready_out is None:
                self._accumulate_leaves(ready_leaves)
            else:
                ready_out.extend(ready_leaves)
        heap = self._heap
        if best is not None and (not heap or heap[0][0] >= -best._seq):
            return best
        if best is not None:
            self.mark_ready(best)
        return self._pop_ready()

    def _accumulate_leaves(self, ready_leaves, rec=None, mark=None):
        """Accumulate ``[(leaf, gradient), ...]`` (emptied) into the leaves' ``.grad``; with
        a profiler's recorder ``rec``, each one's events, the first from ``mark``."""
        while ready_leaves:
            leaf, g = ready_leaves.pop()
            owned = _getrefcount(g) <= 2  # `g` and getrefcount's argument (a line of its
            accumulate_into_grad(leaf._variable, g, owned,  # own: call args hold `g` too)
                                 self.caller_buffers)
            if rec is not None:
                mark = rec.node_ran(profiling.ACCUMULATE, -1, mark, None,
                                    [list(leaf._out_meta[0][0])] if rec.record_shapes else None)

    def _pop_ready(self):
        heap = self._heap
        return heapq.heappop(heap)[2] if heap else None

    def _instrument(self, node, grads):
        """With ``inputs=``: capture gradients at the inputs; say whether ``node`` must run."""
        is_needed = node in self.exec_needed
        caps = self.captures.get(node) if self.captures is not None else None
        if caps:
            # A node that will not run fires only the tensor hooks of captured inputs
            # (PyTorch's note: backward(inputs=) does not fire hooks below the inputs).
            hooked = grads if is_needed else call_tensor_pre_hooks(node, grads)
            for input_nr, index in caps:
                self.captured[index] = hooked[input_nr]
        return is_needed

    def _accumulate(self, node, grads):
        if self.accumulate is not None:
            variable = node.variable
            g = grads[0]
            if g is not None and variable is not None:
                grads[0] = None
                # PyTorch's rule: a gradient nothing else refers to is taken over; one that
                # another leaf of this pass also receives is copied by both (their buffers
                # hold it until accumulated, as PyTorch's engine holds its vector)
                owned = _getrefcount(g) <= 2 and id(g) not in self._shared
                if not owned:
                    self._shared.add(id(g))
                self.accumulate(variable, g, owned)
            return ()
        return node.apply(grads)


def _is_plain_leaf(acc):
    """A leaf accumulator with no hook of any kind (its gradient goes straight to .grad)."""
    var = acc._variable
    return var is not None and acc._pre_hooks is None and acc._post_hooks is None and \
        not var._hooks and not var._post_acc_hooks


def _in_forward_order(parts):
    """The sum of a leaf's ``[(producer sequence number, gradient)]``, earliest producer
    first (stable: one producer's several gradients keep their order)."""
    parts.sort(key=lambda part: part[0])
    total = parts[0][1]
    for _, g in parts[1:]:
        total = sum_grads(total, g)
    return total


def run_backward(roots, root_grads, retain_graph, create_graph, inputs, allow_unused,
                 accumulate_grad, accumulate=None):
    """Run one backward pass; returns the captured gradients when ``accumulate_grad`` is False."""
    task = GraphTask(retain_graph, create_graph, accumulate)
    root_edges = []
    for i, (t, g) in enumerate(zip(roots, root_grads)):
        if not t._requires_grad:
            raise RuntimeError(f"element {i} of tensors does not require grad and does not have "
                               "a grad_fn")
        root_edges.append((t._grad_edge(), g))
    targets = []
    for i, t in enumerate(inputs):
        if not isinstance(t, TensorBase):
            raise TypeError(f"element {i} of inputs is a {type(t).__name__}, not a Tensor")
        if not t._requires_grad:
            raise RuntimeError("One of the differentiated Tensors does not require grad")
        if accumulate_grad and t._grad_fn is not None:
            t.retain_grad()
        targets.append(t._grad_edge())
    root_nodes = [edge[0] for edge, _ in root_edges]
    nodes = task.compute_dependencies(root_nodes)
    if targets:
        task.init_to_execute(nodes, targets, accumulate_grad)
    task.caller_buffers = _buffer_ids(root_grads)
    for (node, nr), g in root_edges:
        if g is not None and isinstance(node, AccumulateGrad) and node._out_meta[0][1] != \
                (g._data.dtype if isinstance(g, TensorBase) else g.dtype):
            dtype = node._out_meta[0][1]
            g = g.to(dtype) if isinstance(g, TensorBase) else g.astype(dtype)
        task.add_gradient(node, nr, g)
    for node in dict.fromkeys(root_nodes):
        if task.dependencies.get(node, 0) == 0:
            task.mark_ready(node)
    execute(task)
    if accumulate_grad:
        return None
    results = []
    for i, (t, g) in enumerate(zip(inputs, task.captured)):
        if g is None:
            if not allow_unused:
                raise RuntimeError("One of the differentiated Tensors appears to not have been "
                                   "used in the graph. Set allow_unused=True if this is the "
                                   "desired behavior.")
            results.append(None)
        elif isinstance(g, TensorBase):
            results.append(g)
        else:
            results.append(_make(g))
    return tuple(results)


def _buffer_ids(arrays):
    """The ids of the arrays that own the memory of ``arrays`` (ndarrays only)."""
    ids = set()
    for a in arrays:
        if type(a) is np.ndarray:
            ids.add(id(a) if a.base is None else id(a.base))
    return ids

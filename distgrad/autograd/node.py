"""Graph nodes: the ``grad_fn`` objects of the backward graph.

A node knows the edges to the nodes that produced its forward inputs
(``next_functions``), the shape and dtype of each of its forward outputs (so the
engine can reduce a broadcast gradient and cast it in one place for every op),
and its hooks. ``AccumulateGrad`` is the node of a leaf tensor.
"""
import itertools
import sys
import threading
import weakref
from collections import OrderedDict

import numpy as np

from . import tensor as _tensor
from .grad_mode import _state

from ..utils.hooks import RemovableHandle

__all__ = ["Node", "AccumulateGrad", "next_sequence_nr", "init_node", "sum_grads",
           "grad_edge", "retain_grad"]

_sequence = itertools.count()
next_sequence_nr = _sequence.__next__


def peek_sequence_nr():
    """The sequence number the next node gets, without taking it (the profiler's mark)."""
    return int(repr(_sequence)[len("count("):-1])

# Leaves run as soon as they are ready, as in PyTorch (UINT64_MAX sequence number).
ACCUMULATE_SEQUENCE_NR = 1 << 62


def init_node(node, next_edges, seq, out_meta):
    """Set the fields every node has (a function, not __init__: op nodes skip __init__)."""
    node._next = next_edges
    node._seq = seq
    node._out_meta = out_meta
    node._pre_hooks = None
    node._post_hooks = None
    node._tensor_pre_hooks = None
    node._retains_grad_hooks = None
    node._metadata = None


class Node:
    """Base of every ``grad_fn``; ``apply(grads)`` maps output gradients to input gradients."""

    __slots__ = ("_next", "_seq", "_out_meta", "_pre_hooks", "_post_hooks",
                 "_tensor_pre_hooks", "_retains_grad_hooks", "_metadata", "__weakref__")

    def __init__(self):
        init_node(self, (), next_sequence_nr(), ())

    # -- introspection, as torch.autograd.graph.Node --
    def name(self):
        return type(self).__name__

    @property
    def next_functions(self):
        return tuple((n, nr) if n is not None else (None, 0) for n, nr in self._next)

    @property
    def metadata(self):
        if self._metadata is None:
            self._metadata = {}
        return self._metadata

    def _sequence_nr(self):
        return self._seq

    def __repr__(self):
        return f"<{type(self).__name__} object at {id(self):#x}>"

    def __call__(self, *grads):
        """Call the node on gradients directly, as PyTorch allows (``y.grad_fn(g)``)."""
        raw = [g if (g is None or _state.grad_enabled) else g._data for g in grads]
        out = self.apply(raw)
        wrapped = tuple(o if (o is None or isinstance(o, _tensor.TensorBase)) else _tensor._make(o)
                        for o in out)
        return wrapped[0] if len(wrapped) == 1 else wrapped

    def apply(self, grads):
        raise NotImplementedError

    def _release(self):
        """Free saved tensors after a backward without ``retain_graph``."""

    # -- hooks --
    def register_prehook(self, fn):
        """``fn(grad_outputs) -> tuple | None``; runs before the node, may replace ``grad_outputs``."""
        if self._pre_hooks is None:
            self._pre_hooks = OrderedDict()
        handle = RemovableHandle(self._pre_hooks)
        self._pre_hooks[handle.id] = fn
        return handle

    def register_hook(self, fn):
        """``fn(grad_inputs, grad_outputs) -> tuple | None``; runs after the node, may replace ``grad_inputs``."""
        if self._post_hooks is None:
            self._post_hooks = OrderedDict()
        handle = RemovableHandle(self._post_hooks)
        self._post_hooks[handle.id] = fn
        return handle

    def _register_tensor_pre_hook(self, output_nr, fn):
        if self._tensor_pre_hooks is None:
            self._tensor_pre_hooks = {}
        hooks = self._tensor_pre_hooks.get(output_nr)
        if hooks is None:
            hooks = self._tensor_pre_hooks[output_nr] = OrderedDict()
        handle = RemovableHandle(hooks)
        hooks[handle.id] = fn
        return handle

    def _set_retains_grad_hook(self, output_nr, fn):
        if self._retains_grad_hooks is None:
            self._retains_grad_hooks = {}
        self._retains_grad_hooks[output_nr] = fn

    def _tensor_hooks_for(self, output_nr):
        if self._tensor_pre_hooks is None:
            return ()
        hooks = self._tensor_pre_hooks.get(output_nr)
        return tuple(hooks.values()) if hooks else ()


# Concurrent backward passes may accumulate into the same leaf; PyTorch locks too.
_accumulate_lock = threading.Lock()
_getrefcount = sys.getrefcount


class AccumulateGrad(Node):
    """The node of a leaf: adds incoming gradients into ``variable.grad``.

    As in PyTorch, the accumulator holds its leaf and the leaf refers to its
    accumulator weakly: the graph keeps the accumulator alive, a leaf outside any
    graph keeps none, and no reference cycle forms. Whoever needs one accumulator
    across forward passes (hooks on it, DDP) holds it.
    """

    __slots__ = ("_variable",)

    def __init__(self, variable):
        init_node(self, (), ACCUMULATE_SEQUENCE_NR, ((variable._data.shape, variable._data.dtype),))
        self._variable = variable
        variable._grad_accumulator = weakref.ref(self)

    @property
    def variable(self):
        return self._variable

    def _tensor_hooks_for(self, output_nr):
        # Hooks on a leaf live on the tensor (so they survive the accumulator).
        hooks = self._variable._hooks
        return tuple(hooks.values()) if hooks else ()

    def _has_any_pre_hooks(self):
        return bool(self._variable._hooks or self._pre_hooks)

    def apply(self, grads):
        g = grads[0]
        variable = self._variable
        if g is not None:
            accumulate_into_grad(variable, g)
            hooks = variable._post_acc_hooks
            if hooks:
                for hook in tuple(hooks.values()):
                    hook(variable)
        return ()


def sum_grads(old, g):
    """``old + g`` for two gradients of one input (either may be None); NumPy turns the
    sum of two 0-d arrays into a scalar, which is made a 0-d array again."""
    if old is None:
        return g
    if g is None:
        return old
    total = old + g
    return np.asarray(total) if isinstance(total, np.generic) else total


def accumulate_into_grad(variable, g, owned=False, caller_buffers=()):
    """``variable.grad += g`` with PyTorch's rules.

    ``owned`` says the caller holds the only reference to the array ``g``: then a
    first gradient is taken over without a copy (PyTorch steals a tensor whose use
    count is one); otherwise it is copied, so ``.grad`` never aliases a tensor the user
    holds (the ``gradient=`` they passed) or another edge's gradient. A contiguous view
    of a buffer in ``caller_buffers`` (the ids of the backward's ``gradient=`` arrays) is
    taken over too: PyTorch steals the fresh view a reshape's backward makes of the
    caller's gradient, so ``.grad`` shares the caller's memory (a later change to
    either shows in both), and so does distgrad.
    """
    with _accumulate_lock:
        old = variable._grad
        if old is None and type(g) is np.ndarray:  # the first dense gradient: most calls
            flags = g.flags
            if not owned or not flags.writeable or not flags.c_contiguous or \
                    (g.base is not None and not _sole_view(g)
                     and id(g.base) not in caller_buffers):
                g = g.copy()
            variable._grad = _tensor._make(g)
            return
        if _is_storage(g) or (old is not None and _is_storage(old._data)):
            _accumulate_storage(variable, old, g, owned)
            return
        if type(g) is not np.ndarray:  # a Tensor, under create_graph: keep the gradient's graph
            if old is None:
                variable._grad = g if _state.grad_enabled else g.detach()
            else:
                variable._grad = old + g
            return
        if old._requires_grad:
            variable._grad = old + _tensor._make(g)
        else:
            data = old._data
            if data.flags.writeable and data.shape == g.shape:
                data += g
                old._vc[0] += 1
            else:
                old._data = data + g


def _sole_view(g):
    """Whether ``g`` is a whole view (a reshape, an unsqueeze) of a buffer nothing else
    refers to: a gradient that ``.grad`` may keep as its caller keeps ``g`` itself. A view
    of the caller's ``gradient=`` or of another gradient still alive is copied."""
    base = g.base
    return type(base) is np.ndarray and base.flags.owndata and base.size == g.size and \
        _getrefcount(base) <= 3  # g's reference, `base` and getrefcount's argument


def _is_storage(a):
    return type(a) is not np.ndarray and isinstance(a, _tensor.ArrayStorage)


def _accumulate_storage(variable, old, g, owned):
    """``.grad += g`` where either is sparse (an ArrayStorage), as PyTorch's AccumulateGrad:
    a sparse gradient is added into a dense ``.grad`` in place; otherwise ``.grad``
    becomes the sum (dense + sparse is dense, in either order)."""
    if isinstance(g, _tensor.TensorBase):  # under create_graph
        new = g if old is not None or _state.grad_enabled else g.detach()
    else:
        new = _tensor._make(g if owned else g.copy())
    if old is None:
        variable._grad = new
        return
    data = old._data
    if type(data) is np.ndarray and not old._requires_grad and data.flags.writeable and \
            _is_storage(new._data) and new._data.dtype == data.dtype:
        sparse = new._data
        if sparse.nnz:
            np.add.at(data, tuple(sparse.indices), sparse.values)
        old._vc[0] += 1
    elif _is_storage(data) and not _is_storage(new._data):
        variable._grad = new + old
    else:
        variable._grad = old + new


# ---------------------------------------------------------------- Tensor methods that need nodes
# (methods of distgrad.Tensor, distgrad/_tensor.py; the core class is below this module)
def grad_edge(self):
    """The (node, input_nr) edge a consumer of this tensor points to."""
    fn = self._grad_fn
    if fn is not None:
        return (fn, self._output_nr)
    ref = self._grad_accumulator
    acc = ref() if ref is not None else None
    if acc is None or acc._out_meta[0][0] != self._data.shape:  # `.data` may have been replaced
        acc = AccumulateGrad(self)
    return (acc, 0)


def retain_grad(self):
    """Populate ``.grad`` of this non-leaf during backward (a no-op on leaves)."""
    if self._grad_fn is None:
        if not self._requires_grad:
            raise RuntimeError("can't retain_grad on Tensor that has requires_grad=False")
        return
    if self._retains_grad:
        return
    ref = weakref.ref(self)

    def retain_grad_hook(grad):
        tensor = ref()
        if tensor is not None and grad is not None:
            if isinstance(grad, _tensor.TensorBase) and not _state.grad_enabled:
                grad = grad._data
            if isinstance(grad, _tensor.TensorBase):
                tensor._grad = grad if tensor._grad is None else tensor._grad + grad
            elif tensor._grad is None:
                tensor._grad = _tensor._make(np.array(grad, copy=True))
            else:
                accumulate_into_grad(tensor, grad)
        return grad

    self._grad_fn._set_retains_grad_hook(self._output_nr, retain_grad_hook)
    self._retains_grad = True

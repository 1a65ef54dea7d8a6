"""Weight gradients of linear layers computed later, in one product per weight.

A pipeline stage runs one backward pass per micro-batch. In each pass a linear
layer's node computes two products: the gradient of its input, which the stage
before is waiting for, and the gradient of its weight, which nobody reads before the
optimizer step. Within :class:`defer_weight_grads`, a pass computes only the first: the
node keeps the two factors of the second (its output gradient and its input), and
:meth:`defer_weight_grads.flush` computes, per weight, one product over the rows of
every pass (in forward order) and accumulates it where the passes would have: into
``.grad``, or into the distributed autograd context a pass belonged to.

Why: the stage before gets its gradient after half the backward (the split of B
into input and weight gradients of zero-bubble pipelines, Qi et al. 2023, as
``torch.distributed.pipelining`` does with ``stage_backward_input`` and
``stage_backward_weight``), and one product over the whole batch runs at the BLAS's
full-batch speed where one product per micro-batch of a few rows does not.

Only what keeps every result exact is deferred; the rest runs as usual:
- a weight with hooks of any kind (they would see one sum instead of one gradient per
  pass);
- a pass with ``create_graph=True`` or ``inputs=`` (``autograd.grad``: the caller
  wants the gradient now).
The factors are summed in forward order (the nodes' sequence numbers), whatever order
the passes ran in, so the result is the same bit for bit on every run. The price is
memory: each deferred input is kept until the flush.
"""
import threading

import numpy as np

from .engine import _is_plain_leaf, current_graph_task
from .grad_mode import _state
from .node import AccumulateGrad, accumulate_into_grad

__all__ = ["defer_weight_grads", "keep_weight_grad", "WeightGradStore"]

# accumulator node of a weight -> the defer_weight_grads it is registered with
_registered = {}
_registry_lock = threading.Lock()


def keep_weight_grad(node, grads, weight_input=1):
    """For the backward of a linear node computing ``g.T @ x`` for its weight (input
    ``weight_input``, with ``x`` its first saved value): when that gradient is deferred,
    keep its factors for the flush and return ``(saved arrays, which inputs need a
    gradient now)``; else None, and the node computes everything as usual.

    A weight is deferred by the :class:`defer_weight_grads` it is registered with, or
    else by the pass itself when the pass keeps a store of its own
    (``GraphTask.weight_grads``: a part of a distributed backward, flushed when the part
    ends). Cheap when nothing is deferred."""
    if grads[0] is None:
        return None
    accumulator = node._next[weight_input][0]
    if type(accumulator) is not AccumulateGrad:
        return None  # the weight is computed (tied, scaled): its gradient flows on now
    store = _registered.get(accumulator) if _registered else None
    task = current_graph_task()
    if store is None:
        if task is None or task.weight_grads is None or node._saved[0]._has_hooks:
            return None  # an input under saved-tensor hooks (offloaded) would be kept
        store = task.weight_grads
    if _state.grad_enabled or not _is_plain_leaf(accumulator):
        return None  # hooks would see one sum instead of one gradient per pass
    if task is None or task.exec_needed is not None or task.create_graph:
        return None  # autograd.grad / inputs= / create_graph: wanted now
    saved = [s.data(node) for s in node._saved]
    store.keep(accumulator, node._seq, grads[0], saved[0], task.accumulate)
    needs = [nxt is not None for nxt, _ in node._next]
    needs[weight_input] = False
    return saved, needs


class WeightGradStore:
    """The factors of deferred weight gradients, and the products that turn them into
    gradients: kept per weight (and per place they accumulate into) until :meth:`flush`."""

    def __init__(self):
        self._lock = threading.Lock()
        self._pending = {}   # (accumulator, accumulate) -> [(sequence number, g, x)]

    def keep(self, accumulator, seq, g, x, accumulate):
        """Keep one pass's factors of a weight gradient (a linear node's backward calls
        this): ``g`` the output gradient, ``x`` the input, both with the feature axis
        last; ``accumulate`` the pass's leaf accumulation (None: into ``.grad``)."""
        g = g.reshape(-1, g.shape[-1])
        x = x.reshape(-1, x.shape[-1])
        with self._lock:
            self._pending.setdefault((accumulator, accumulate), []).append((seq, g, x))

    def pending(self):
        """How many passes' weight gradients wait for :meth:`flush`."""
        with self._lock:
            return sum(len(parts) for parts in self._pending.values())

    def work(self):
        """The multiply-adds :meth:`flush` would run."""
        with self._lock:
            return sum(g.shape[0] * g.shape[1] * x.shape[1]
                       for parts in self._pending.values() for _, g, x in parts)

    def flush(self):
        """Compute and accumulate every kept weight gradient: one product per weight
        (and per distributed context), over the passes' rows in forward order. Returns
        how many passes' gradients it computed."""
        with self._lock:
            pending, self._pending = self._pending, {}
        for (accumulator, accumulate), parts in pending.items():
            parts.sort(key=lambda part: part[0])
            if len(parts) == 1:
                _, g, x = parts[0]
            else:
                g = np.concatenate([p[1] for p in parts])
                x = np.concatenate([p[2] for p in parts])
            grad = np.matmul(g.T, np.conj(x))
            variable = accumulator._variable
            if accumulate is None:
                accumulate_into_grad(variable, grad, owned=True)
            else:
                accumulate(variable, grad, True)
        return sum(len(parts) for parts in pending.values())

    def discard(self):
        """Drop what is kept (a failed step: its gradients are not wanted)."""
        with self._lock:
            self._pending = {}


class defer_weight_grads(WeightGradStore):
    """``with defer_weight_grads(weights) as deferred:`` backward passes leave the
    gradients of these linear-layer weights for :meth:`flush` (called on exit too).
    A deferral that spans many steps uses :meth:`activate` and :meth:`deactivate`.

    ``weights`` are leaf tensors (parameters); those no linear layer uses are simply
    never deferred. A weight belongs to one deferral at a time.
    """

    def __init__(self, weights):
        self._accumulators = []
        for w in weights:
            if not w.requires_grad or w.grad_fn is not None:
                raise ValueError("defer_weight_grads takes leaf tensors that require grad, got "
                                 f"a tensor of shape {tuple(w.shape)} that "
                                 + ("does not require grad" if not w.requires_grad
                                    else "is not a leaf"))
            self._accumulators.append(w._grad_edge()[0])  # held: the graph reuses it
        super().__init__()

    def __enter__(self):
        return self.activate()

    def __exit__(self, exc_type, exc, tb):
        self.deactivate()
        if exc_type is None:
            self.flush()
        else:
            self.discard()

    def activate(self):
        """Start deferring (what ``with`` does on entry); returns self."""
        with _registry_lock:
            taken = [a for a in self._accumulators if a in _registered]
            if taken:
                shape = tuple(taken[0]._variable.shape)
                raise RuntimeError(f"defer_weight_grads: the weight of shape {shape} is "
                                   "already deferred by another defer_weight_grads")
            for a in self._accumulators:
                _registered[a] = self
        return self

    def deactivate(self):
        """Stop deferring; what is kept stays for :meth:`flush` or :meth:`discard`."""
        with _registry_lock:
            for a in self._accumulators:
                if _registered.get(a) is self:
                    del _registered[a]

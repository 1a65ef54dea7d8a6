"""In-place updates: version counters, PyTorch's checks, and graph rebasing.

An in-place op is its out-of-place op plus a write: the recorded node computes
the new value from an alias of the old one, the result is written into the
tensor's buffer, and the tensor's ``grad_fn`` becomes the new node. When the
tensor is a view, its base's history is rebased through a ``CopySlices`` node,
as in PyTorch, so the gradient reaches the base's earlier history correctly.
"""
import numpy as np

from .dtype import scalar_type_name
from .grad_mode import _state, thread_state
from .node import Node, init_node, next_sequence_nr
from .recording import defop, new_node
from .tensor import TensorBase, _make

__all__ = ["apply_inplace", "check_inplace", "write_inplace"]


def check_inplace(t):
    if t._is_inference and not _state.inference:
        raise RuntimeError("Inplace update to inference tensor outside InferenceMode is not "
                           "allowed.You can make a clone to get a normal tensor before doing "
                           "inplace update.See https://github.com/pytorch/rfcs/pull/17 for more "
                           "details.")
    if _state.grad_enabled:
        if t._grad_fn is None and t._requires_grad:
            if t._base is not None:
                raise RuntimeError("a view of a leaf Variable that requires grad is being used in "
                                   "an in-place operation.")
            raise RuntimeError("a leaf Variable that requires grad is being used in an in-place "
                               "operation.")
        custom_view = t.__dict__.get("_custom_function_view") if t.__dict__ else None
        if custom_view is not None and t._grad_fn is not None:
            nr, fn_name = custom_view
            raise RuntimeError(
                f"Output {nr} of {fn_name} is a view and is being modified inplace. This view was "
                "created inside a custom Function (or because an input was returned as-is) and "
                "the autograd logic to handle view+inplace would override the custom backward "
                "associated with the custom Function, leading to incorrect gradients. This "
                "behavior is forbidden. You can fix this by cloning the output of the custom "
                "Function.")
        base = t._base
        if base is not None and base._grad_fn is None and base._requires_grad:
            raise RuntimeError("a view of a leaf Variable that requires grad is being used in an "
                               "in-place operation.")


def write_inplace(t, value):
    """Write ``value`` (an ndarray) into ``t``'s buffer and bump the version counter."""
    dst = t._data
    if value.dtype != dst.dtype and not np.can_cast(value.dtype, dst.dtype, casting="same_kind"):
        raise RuntimeError(f"result type {scalar_type_name(value.dtype)} can't be cast to the "
                           f"desired output type {scalar_type_name(dst.dtype)}")
    if not dst.flags.writeable:
        if dst.base is not None and 0 in dst.strides and dst.size > 1:
            raise RuntimeError("unsupported operation: more than one element of the written-to "
                               "tensor refers to a single memory location. Please clone() the "
                               "tensor before performing the operation.")
        raise RuntimeError(f"in-place operation on a read-only tensor of shape {list(dst.shape)} "
                           "(for example one received over RPC); clone() it first")
    if value.shape != dst.shape:
        try:
            value = np.broadcast_to(value, dst.shape)
        except ValueError:
            raise RuntimeError(f"output with shape {list(dst.shape)} doesn't match the broadcast "
                               f"shape {list(value.shape)}") from None
    np.copyto(dst, value, casting="unsafe")
    t._vc[0] += 1


def apply_inplace(self, fn, *args, **kwargs):
    """``self <- fn(self, *args, **kwargs)`` in place, recording the graph when needed."""
    check_inplace(self)
    recording = _state.grad_enabled and (self._requires_grad or (self._base is not None and
                                                                  self._base._requires_grad) or
                                         any(isinstance(a, TensorBase) and a._requires_grad
                                             for a in args))
    if not recording:
        with thread_state(_state, grad_enabled=False):
            res = fn(self, *args, **kwargs)
        write_inplace(self, res._data)
        return self
    # The node sees an alias of the old value, with its own version counter, so
    # that bumping `self` does not invalidate what the node saved of the old value.
    # (A leaf that requires grad never gets here: check_inplace refused it.)
    old = _make(self._data, self._grad_fn, self._output_nr, self._requires_grad)
    res = fn(old, *args, **kwargs)
    node = res._grad_fn
    if node is not None and any(s._tensor is old for s in getattr(node, "_saved", ())):
        old._data = old._data.copy()
    write_inplace(self, res._data)
    if node is None:
        return self
    for s in getattr(node, "_saved", ()):
        if s._is_output and not s._has_hooks:
            s._data = self._data
            s._vc = self._vc
            s._version = self._vc[0]
    base = self._base
    if base is not None and self._view_fn is not None:
        _rebase_view(self, base, node)
    else:
        self._grad_fn = node
        self._output_nr = res._output_nr
        self._requires_grad = True
    return self


class CopySlices(Node):
    """The base's new ``grad_fn`` after an in-place op on one of its views."""

    __slots__ = ("fn", "view_fn", "base_shape")

    def apply(self, grads):
        if _state.grad_enabled:
            raise RuntimeError("double backward (create_graph=True) through an in-place op on a "
                               "view is not supported by distgrad; clone() the view first")
        g = grads[0]
        result = np.array(g, copy=True)
        region = self.view_fn(result)
        res = self.fn.apply([np.array(region, copy=True)])
        region[...] = 0 if res[0] is None else res[0]
        return (result,) + tuple(res[1:])

    def _release(self):
        self.fn._release()


def _as_view_grad(xp, g, m):
    if xp.is_tensor_backend():
        raise RuntimeError("double backward (create_graph=True) through a view of a tensor "
                           "modified in place is not supported by distgrad")
    out = np.zeros(m["base_shape"], dtype=g.dtype)
    m["view_fn"](out)[...] = g
    return out


AsStridedBackward0 = defop("AsStridedBackward0", vjps=(_as_view_grad,))


def _rebase_view(view, base, node):
    copy = object.__new__(CopySlices)
    base_edge = base._grad_edge() if base._requires_grad else (None, 0)
    init_node(copy, (base_edge,) + node._next[1:], next_sequence_nr(),
              ((base._data.shape, base._data.dtype),))
    copy.fn = node
    copy.view_fn = view._view_fn
    copy.base_shape = base._data.shape
    base._grad_fn = copy
    base._output_nr = 0
    base._requires_grad = True
    # The view's history is now "a view of the new base".
    vnode = new_node(AsStridedBackward0, (base._grad_edge(),),
                      {"base_shape": base._data.shape, "view_fn": view._view_fn},
                      ((view._data.shape, view._data.dtype),))
    vnode._saved = ()
    view._grad_fn = vnode
    view._output_nr = 0
    view._requires_grad = True

"""Custom differentiable operations: ``distgrad.autograd.Function``, as ``torch.autograd.Function``.

    class Exp(Function):
        @staticmethod
        def forward(ctx, x):
            y = x.exp()
            ctx.save_for_backward(y)
            return y

        @staticmethod
        def backward(ctx, grad):
            (y,) = ctx.saved_tensors
            return grad * y

``ctx`` is the graph node itself (so ``y.grad_fn`` is ``ctx``), and its class is
named ``<Name>Backward``.
"""
import functools

import numpy as np

from .grad_mode import _state, no_grad
from .node import Node
from .saved import SavedTensor, RELEASED_MESSAGE
from .tensor import TensorBase, _make

__all__ = ["Function", "FunctionCtx", "BackwardCFunction", "once_differentiable"]


class FunctionCtx:
    """What ``forward`` may tell ``backward``; the methods are shared by the node class."""

    def save_for_backward(self, *tensors):
        for t in tensors:
            if t is not None and not isinstance(t, TensorBase):
                raise TypeError("save_for_backward can only save variables, but argument "
                                f"{tensors.index(t)} is of type {type(t).__name__}")
        self.to_save = tensors

    def save_for_forward(self, *tensors):
        self.saved_for_forward = tensors

    def mark_dirty(self, *args):
        self.dirty_tensors = args

    def mark_non_differentiable(self, *args):
        self.non_differentiable = args

    def set_materialize_grads(self, value):
        self._materialize_grads = bool(value)


class BackwardCFunction(Node, FunctionCtx):
    """The node of one call of a custom Function (and its ``ctx``)."""

    _forward_cls = None

    def __init__(self):
        Node.__init__(self)
        self.to_save = ()
        self.dirty_tensors = ()
        self.non_differentiable = ()
        self._materialize_grads = True
        self._saved = None
        self._released = False
        self.needs_input_grad = ()
        self._tensor_positions = ()

    @property
    def saved_tensors(self):
        if self._released:
            raise RuntimeError(RELEASED_MESSAGE)
        if self._saved is None:
            return tuple(self.to_save)  # inside forward, before apply() froze them
        return tuple(None if s is None else s.unpack(self) for s in self._saved)

    saved_variables = saved_tensors

    def apply(self, grads):
        create_graph = _state.grad_enabled
        user = []
        for g, meta in zip(grads, self._out_meta):
            if g is None:
                if self._materialize_grads:
                    g = np.zeros(meta[0], dtype=meta[1])
                else:
                    user.append(None)
                    continue
            user.append(g if isinstance(g, TensorBase) else _make(g))
        result = self._forward_cls.backward(self, *user)
        if not isinstance(result, tuple):
            result = (result,)
        n_args = len(self.needs_input_grad)
        if len(result) != n_args:
            if len(result) > n_args and all(r is None for r in result[n_args:]):
                result = result[:n_args]
            else:
                raise RuntimeError(f"function {type(self).__name__} returned an incorrect number "
                                   f"of gradients (expected {n_args}, got {len(result)})")
        out = []
        for pos in self._tensor_positions:
            r = result[pos]
            if r is not None and not isinstance(r, TensorBase):
                raise TypeError(f"function {type(self).__name__} returned a gradient of type "
                                f"{type(r).__name__} at position {pos}, expected a Tensor or None")
            # A gradient for an input that needs none is kept: node post-hooks see it, as
            # in PyTorch, and the engine drops it at the missing edge.
            out.append(r if (r is None or create_graph) else r._data)
        return tuple(out)

    def _release(self):
        self._released = True
        if self._saved:
            for s in self._saved:
                if s is not None:
                    s.release()
        self.to_save = ()


class FunctionMeta(type):
    def __init__(cls, name, bases, attrs):
        backward_cls = type(name + "Backward", (BackwardCFunction,), {"_forward_cls": cls})
        backward_cls.__module__ = cls.__module__
        backward_cls.__qualname__ = name + "Backward"
        cls._backward_cls = backward_cls
        super().__init__(name, bases, attrs)


class Function(FunctionCtx, metaclass=FunctionMeta):
    """Base class of custom ops; call them with ``MyFn.apply(*args)``."""

    def __init__(self, *args, **kwargs):
        raise RuntimeError("Legacy autograd function with non-static forward method is deprecated. "
                           "Please use new-style autograd function with static forward method.")

    @staticmethod
    def forward(ctx, *args, **kwargs):
        raise NotImplementedError("You must implement the forward function for custom "
                                  "autograd.Function.")

    @staticmethod
    def setup_context(ctx, inputs, output):
        raise NotImplementedError("setup_context is not implemented.")

    @staticmethod
    def backward(ctx, *grad_outputs):
        raise NotImplementedError("You must implement either the backward or vjp method for your "
                                  "custom autograd.Function to use it with backward mode AD.")

    vjp = backward

    @staticmethod
    def jvp(ctx, *grad_inputs):
        raise NotImplementedError("forward-mode AD (jvp) is not supported by distgrad")

    @classmethod
    def apply(cls, *args, **kwargs):
        ctx = cls._backward_cls()
        positions = tuple(i for i, a in enumerate(args) if isinstance(a, TensorBase))
        ctx._tensor_positions = positions
        ctx.needs_input_grad = tuple(isinstance(a, TensorBase) and a._requires_grad for a in args)
        is_executable = _state.grad_enabled and any(ctx.needs_input_grad)
        uses_setup_context = cls.setup_context is not Function.setup_context
        with no_grad():
            if uses_setup_context:
                output = cls.forward(*args, **kwargs)
                cls.setup_context(ctx, args, output)
            else:
                output = cls.forward(ctx, *args, **kwargs)
        return _wrap_outputs(ctx, args, positions, output, is_executable)


def _wrap_outputs(ctx, args, positions, output, is_executable):
    single = not isinstance(output, tuple)
    outputs = (output,) if single else output
    input_ids = {id(args[p]): args[p] for p in positions}
    dirty = {id(t) for t in ctx.dirty_tensors}
    non_diff = {id(t) for t in ctx.non_differentiable}
    wrapped = []
    for i, out in enumerate(outputs):
        if not isinstance(out, TensorBase):
            wrapped.append(out)
            continue
        if id(out) in dirty:
            if is_executable and out._grad_fn is None and out._requires_grad:
                raise RuntimeError("a leaf Variable that requires grad has been used in an "
                                   "in-place operation.")
            t = out
        elif id(out) in input_ids:
            # Returning an input unchanged gives a new tensor aliasing it (PyTorch makes a view).
            t = _make(out._data, vc=out._vc)
        else:
            t = out
        wrapped.append(t)
    if is_executable:
        ctx._next = tuple(args[p]._grad_edge() if args[p]._requires_grad else (None, 0)
                          for p in positions)
        metas = []
        for i, t in enumerate(wrapped):
            if isinstance(t, TensorBase):
                metas.append((t._data.shape, t._data.dtype))
                differentiable = id(outputs[i]) not in non_diff and t._data.dtype.kind in "fc"
                if differentiable:
                    t._grad_fn = ctx
                    t._output_nr = i
                    t._requires_grad = True
                elif t._grad_fn is None:
                    t._requires_grad = False
            else:
                metas.append(((), np.dtype(np.float32)))
        ctx._out_meta = tuple(metas)
    else:
        ctx._next = ()
        ctx._out_meta = tuple(((t._data.shape, t._data.dtype) if isinstance(t, TensorBase) else
                               ((), np.dtype(np.float32))) for t in wrapped)
    ctx._saved = _save_for_backward(ctx, wrapped) if is_executable else ()
    ctx.to_save = ()
    return wrapped[0] if single else tuple(wrapped)


def _save_for_backward(ctx, wrapped):
    # Only a node that joined the graph saves anything (PyTorch's is_executable): with
    # grad off there is no backward to save for, so inference tensors are fine here.
    out_ids = {id(t): i for i, t in enumerate(wrapped) if isinstance(t, TensorBase)}
    saved = []
    for s in ctx.to_save:
        if s is None:
            saved.append(None)
        elif id(s) in out_ids and s._grad_fn is ctx:
            saved.append(SavedTensor(s, True, out_ids[id(s)]))
        else:
            saved.append(SavedTensor(s, False))
    return tuple(saved)


def once_differentiable(fn):
    """Run a custom backward without recording; differentiating its result again raises."""
    @functools.wraps(fn)
    def wrapper(ctx, *args):
        with no_grad():
            outputs = fn(ctx, *args)
        if not _state.grad_enabled:
            return outputs
        inputs = [a for a in args if isinstance(a, TensorBase) and a._requires_grad]
        if not inputs:
            return outputs
        # As PyTorch's DelayedError: the result joins the graph, and backward through it fails.
        single = not isinstance(outputs, tuple)
        wrapped = tuple(_DelayedError.apply(o, *inputs) if isinstance(o, TensorBase) else o
                        for o in ((outputs,) if single else outputs))
        return wrapped[0] if single else wrapped
    return wrapper


class _DelayedError(Function):
    @staticmethod
    def forward(ctx, value, *inputs):
        return value.clone()

    @staticmethod
    def backward(ctx, *grads):
        raise RuntimeError("trying to differentiate twice a function that was marked with "
                           "@once_differentiable")

"""Saved tensors: what a node keeps for its backward, with version checks and pack/unpack hooks.

Mirrors PyTorch's ``SavedVariable``: an input is kept by reference (so
``grad_fn._saved_self is x``); the node's own output is kept as its buffer and
version counter only, because a reference to the output tensor would make a
cycle (output -> grad_fn -> output) that keeps activations alive.
"""
import weakref

from .grad_mode import ThreadState, _state, thread_state
from .node import AccumulateGrad
from .tensor import TensorBase, _describe, _make

__all__ = ["SavedTensor", "KeptInput", "SavedTensorHooksState", "hooks_state"]

RELEASED_MESSAGE = (
    "Trying to backward through the graph a second time (or directly access saved tensors "
    "after they have already been freed). Saved intermediate values of the graph are freed "
    "when you call .backward() or autograd.grad(). Specify retain_graph=True if you need to "
    "backward through the graph a second time or if you need to access saved tensors after "
    "calling backward.")


class SavedTensorHooksState(ThreadState):
    """Thread-local stack of default (pack, unpack) pairs; the innermost wins."""

    def __init__(self):
        super().__init__(disabled_message=None)
        self.stack = []


hooks_state = SavedTensorHooksState()


class SavedTensor:
    __slots__ = ("_tensor", "_data", "_vc", "_version", "_is_output", "_output_nr",
                 "_requires_grad", "_packed", "_unpack_hook", "_released", "_has_hooks", "_edge")

    def __init__(self, tensor, is_output, output_nr=0):
        if tensor._is_inference:
            raise RuntimeError(
                "Inference tensors cannot be saved for backward. To work around you can make a "
                "clone to get a normal tensor and use it in autograd.")
        self._is_output = is_output
        self._output_nr = output_nr
        self._released = False
        self._requires_grad = tensor._requires_grad
        self._version = tensor._vc[0]
        self._vc = tensor._vc
        self._edge = None
        stack = hooks_state.stack
        if stack:
            pack, unpack = stack[-1]
            self._tensor = None
            self._data = None
            self._has_hooks = True
            self._edge = _input_edge(tensor, is_output)
            self._unpack_hook = unpack
            self._packed = _run_pack_hook(pack, tensor)
        else:
            self._has_hooks = False
            self._packed = None
            self._unpack_hook = None
            if is_output:
                self._tensor = None
                self._data = tensor._data
            else:
                self._tensor = tensor
                self._data = None

    def _check_version(self, node):
        if self._vc[0] != self._version:
            owner = f"output {self._output_nr} of {type(node).__name__}" if self._is_output else \
                "an input of " + type(node).__name__
            _raise_modified(self._data if self._tensor is None else self._tensor._data, owner,
                            self._vc[0], self._version)

    def data(self, node):
        """The saved array, for the engine's NumPy fast path."""
        if self._released:
            raise RuntimeError(RELEASED_MESSAGE)
        if self._has_hooks:
            return self._unpacked(node)._data
        self._check_version(node)
        return self._data if self._tensor is None else self._tensor._data

    def unpack(self, node):
        """The saved tensor as a Tensor: the input object itself, or a fresh output tensor."""
        if self._released:
            raise RuntimeError(RELEASED_MESSAGE)
        if self._has_hooks:
            return self._unpacked(node)
        self._check_version(node)
        if self._tensor is not None:
            return self._tensor
        return _make(self._data, grad_fn=node if self._requires_grad else None,
                     output_nr=self._output_nr, requires_grad=self._requires_grad, vc=self._vc)

    def _unpacked(self, node):
        value = self._unpack_hook(self._packed)
        if not isinstance(value, TensorBase):
            raise TypeError(
                "Output of saved tensor unpack_hook expected to be a Tensor but got result of "
                f"type {type(value).__name__}")
        if value.grad_fn is None:
            # As PyTorch: what an unpack hook returns is reattached where the saved tensor
            # was in the graph, so a hook may return a detached copy and double backward
            # still reaches the producer (or the leaf) of the original.
            if self._is_output and self._requires_grad:
                value = _make(value._data, grad_fn=node, output_nr=self._output_nr,
                              requires_grad=True, vc=value._vc)
            elif self._edge is not None:
                fn, nr = self._edge
                if isinstance(fn, AccumulateGrad):  # a leaf: share its accumulator
                    value = _make(value._data, requires_grad=True, vc=value._vc)
                    value._grad_accumulator = weakref.ref(fn)
                else:
                    value = _make(value._data, grad_fn=fn, output_nr=nr, requires_grad=True,
                                  vc=value._vc)
        return value

    def register_hooks(self, pack_hook, unpack_hook):
        """Pack now, unpack at each access (``grad_fn._raw_saved_x.register_hooks``)."""
        if self._released:
            raise RuntimeError(RELEASED_MESSAGE)
        if self._has_hooks:
            raise RuntimeError("SavedTensor hooks have already been set on this SavedTensor; "
                               "they can be set only once.")
        if not callable(pack_hook) or not callable(unpack_hook):
            raise TypeError("register_hooks expects two callables (pack_hook, unpack_hook)")
        if self._tensor is not None:
            tensor = self._tensor
        else:
            tensor = _make(self._data, requires_grad=False, vc=self._vc)
        self._edge = _input_edge(self._tensor, self._is_output) if self._tensor is not None else None
        self._packed = _run_pack_hook(pack_hook, tensor)
        self._unpack_hook = unpack_hook
        self._has_hooks = True
        self._tensor = None
        self._data = None

    def release(self):
        self._released = True
        self._tensor = None
        self._data = None
        self._packed = None
        self._unpack_hook = None  # and what the hook holds (a checkpoint's inputs), as PyTorch


class KeptInput:
    """A non-differentiable input (a mask, a condition, an index) whose array an op's VJP
    reads from the node's ``meta``: backward refuses it once it was modified in place, as
    PyTorch's saved variables do, instead of using the new values."""

    __slots__ = ("_data", "_vc", "_version")

    def __init__(self, tensor):
        self._data = tensor._data
        self._vc = tensor._vc
        self._version = tensor._vc[0]

    def check_version(self, node):
        if self._vc[0] != self._version:
            _raise_modified(self._data, "an input of " + type(node).__name__, self._vc[0],
                            self._version)


def _raise_modified(array, owner, version, expected):
    raise RuntimeError(
        "one of the variables needed for gradient computation has been modified by an "
        f"inplace operation: [{_describe(array)}], which is {owner}, is at version {version}; "
        f"expected version {expected} instead. Hint: the saved tensor was modified in place "
        "after it was saved for backward; use an out-of-place op or .clone() before modifying it.")


def _run_pack_hook(pack, tensor):
    # As PyTorch, a pack hook runs with grad off: what it computes is storage, not part of
    # the graph, and an op inside it that saves a tensor must not call the hook again.
    with thread_state(_state, grad_enabled=False):
        return pack(tensor)


def _input_edge(tensor, is_output):
    """Where a saved input that requires grad sits in the graph (an output is its node's own)."""
    if is_output or not tensor._requires_grad:
        return None
    if tensor._grad_fn is not None:
        return (tensor._grad_fn, tensor._output_nr)
    return tensor._grad_edge()

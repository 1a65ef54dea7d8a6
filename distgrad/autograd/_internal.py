"""The one declared door to tensor internals, for the other packages of distgrad.

A Tensor keeps its array, version counter, view base and ``grad_fn`` in private
slots. Ops, layers, optimizers and the distributed engine need some of that, and
this module is everything they may use; anything else goes through the public
API. ``tests/test_import_graph.py`` fails on a private tensor attribute used, or an
underscore name imported from ``autograd``, anywhere outside ``autograd``.

    from distgrad.autograd._internal import array_of, wrap, bump_version

    out = wrap(np.tanh(array_of(x)))     # an ndarray as a new leaf, no copy
    array_of(p)[...] -= lr * g           # in place on the storage...
    bump_version(p)                      # ...and the version counter says so

Recording an op (``defop``/``record``, see ``recording.py``) and the local engine's
extension point for the distributed engine and checkpointing (``GraphTask``,
``task_extension``, ``execute``) are part of the door too.
"""
from .broadcast import reduction_axes, sum_to_shape
from .deferred_weight_grads import keep_weight_grad
from .engine import (GraphTask, as_tuple, current_graph_task, execute, make_root_grads,
                     set_task_extension, task_extension)
from .grad_mode import _state as grad_mode_state
from .inplace import apply_inplace, check_inplace, write_inplace
from .op_observers import OpObserver, cached_output
from .node import (AccumulateGrad, Node, accumulate_into_grad, grad_edge, init_node,
                   next_sequence_nr, retain_grad, sum_grads)
from .profiling import observed
from .recording import (OpNode, defop, install_backends, new_node, record, record_multi,
                        record_view, runs_only_builtin_code)
from .saved import SavedTensor, hooks_state as saved_tensors_hooks_state
from .tensor import (Size, TensorBase, install_tensor_type, _as_array as as_array,
                     _describe as describe,
                     _legacy_array as legacy_array, _make as wrap, _wrap_dim as wrap_dim)

__all__ = [
    # arrays and versions
    "array_of", "set_array", "wrap", "bump_version", "version_counter", "share_version",
    "as_array", "legacy_array", "describe", "wrap_dim", "reduction_axes", "sum_to_shape",
    # graph state of a tensor
    "set_history", "clear_history", "grad_edge", "grad_accumulator", "view_base", "view_fn",
    "set_view", "is_inference_tensor", "mark_requires_grad",
    # in-place updates
    "apply_inplace", "check_inplace", "write_inplace",
    # recording ops
    "defop", "record", "record_view", "record_multi", "new_node", "OpNode", "install_backends",
    "keep_weight_grad", "observed", "runs_only_builtin_code",
    # what ops a thread records, as they are recorded (selective checkpointing, its log)
    "OpObserver", "cached_output",
    "Node", "AccumulateGrad", "init_node", "next_sequence_nr", "SavedTensor", "sum_grads",
    "accumulate_into_grad", "saved_tensors_hooks_state", "grad_mode_state",
    # the engine, for the distributed engine
    "GraphTask", "execute", "make_root_grads", "current_graph_task", "as_tuple",
    "task_extension", "set_task_extension",
    "Size", "TensorBase", "install_tensor_type", "retain_grad",
]


def array_of(t):
    """The ndarray that holds ``t``'s elements (shared, not copied)."""
    return t._data


def set_array(t, array):
    """Make ``array`` the storage of ``t`` (what ``t.data = ...`` does, without the checks)."""
    t._data = array


def bump_version(t):
    """Record that ``t``'s storage was written in place, so saved copies of it fail loudly."""
    t._vc[0] += 1


def version_counter(t):
    """``t``'s version counter: a one-element list that views of ``t`` share."""
    return t._vc


def share_version(t, source):
    """Make ``t`` share ``source``'s version counter (``t`` aliases its storage)."""
    t._vc = source._vc


def set_history(t, node, output_nr=0):
    """Make ``t`` output ``output_nr`` of ``node`` (its ``grad_fn``); it then requires grad."""
    t._grad_fn = node
    t._output_nr = output_nr
    t._requires_grad = True


def clear_history(t):
    """Cut ``t`` from the graph in place (``detach_`` without its view check)."""
    t._grad_fn = None
    t._output_nr = 0
    t._requires_grad = False


def mark_requires_grad(t, value=True):
    """Set ``requires_grad`` of a leaf without ``requires_grad_``'s dtype checks (for a
    tensor the caller just made from an array known to be floating point)."""
    t._requires_grad = value


def grad_accumulator(t):
    """The live AccumulateGrad of leaf ``t``, or None (a leaf holds it weakly, as PyTorch)."""
    ref = t._grad_accumulator
    return ref() if ref is not None else None


def view_base(t):
    """The tensor whose storage the view ``t`` shares, or None."""
    return t._base


def view_fn(t):
    """How to recompute the view ``t`` from its base's array (None when unknown)."""
    return t._view_fn


def set_view(t, base, fn):
    """Make ``t`` a view of ``base`` (sharing its version counter) recomputed by ``fn``."""
    t._base = base
    t._view_fn = fn
    t._vc = base._vc


def is_inference_tensor(t):
    return t._is_inference

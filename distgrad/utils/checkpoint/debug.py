"""``checkpoint(..., debug=True)``: when the recomputation saves other tensors than the
forward did, the error lists the ops of both runs, each with where it was called.

Two op observers (see ``distgrad/autograd/op_observers.py``) log every op the forward
and the recomputation record; a :class:`~.frames.CheckpointError` raised while
unpacking is replaced by one that shows both logs.
"""
import os
import traceback

from ...autograd._internal import OpObserver, array_of
from ...ops.overloads import op_of
from .frames import CheckpointError, Override

__all__ = ["set_checkpoint_debug_enabled", "debug_enabled", "debug_contexts"]

_debug = Override()
_PACKAGE = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def set_checkpoint_debug_enabled(enabled):
    """Whether checkpoints made in this block run as with ``debug=True`` (True), as without
    (False), or as each call says (None, the default); it overrides ``debug=``."""
    return _debug.block(enabled)


def debug_enabled(requested):
    return _debug.resolve(requested)


def _describe(t):
    a = array_of(t)
    return f"{a.dtype.name}{list(a.shape)}"


class _OpLog(OpObserver):
    """Every op one run records, with the user code that called it."""

    def __init__(self):
        self.lines = []
        self.stacks = []

    def __enter__(self):
        self.lines, self.stacks = [], []
        return super().__enter__()

    def after(self, node_cls, result, inputs, meta):
        args = ", ".join("None" if t is None else _describe(t) for t in inputs)
        outs = ", ".join(_describe(t) for t in (result if isinstance(result, list) else [result]))
        self.lines.append(f"{op_of(node_cls)}({args}) -> {outs}")
        # distgrad's own frames say nothing about where the op came from
        frames = [f for f in traceback.extract_stack()[:-1]
                  if not os.path.abspath(f.filename).startswith(_PACKAGE)]
        self.stacks.append([f"{f.filename}:{f.lineno}:{f.name}" for f in frames[-8:]])


def _report(label, log):
    out = []
    for i, (line, stack) in enumerate(zip(log.lines, log.stacks)):
        out.append(f"{line}   ({i + 1} of {len(log.lines)} in {label})")
        out.extend(f"    {frame}" for frame in stack)
    return "\n".join(out) or "(no ops)"


def debug_contexts():
    """``(context_fn, on_error)`` of a debugged checkpoint."""
    forward, recompute = _OpLog(), _OpLog()

    def on_error(error):
        raise CheckpointError(
            "torch.utils.checkpoint (debug=True): the recomputation saved other tensors than "
            "the original forward. Compare the ops of the two runs below (in the order they "
            "ran, each followed by the calls that led to it, innermost last); where they part "
            "is where the function behaved differently the second time (randomness without "
            "preserve_rng_state, global state, data-dependent control flow).\n\n"
            f"== ops of the original forward ==\n{_report('original', forward)}\n\n"
            f"== ops of the recomputation ==\n{_report('recompute', recompute)}\n\n"
            f"== the error ==\n{error}") from error

    return (lambda: (forward, recompute)), on_error

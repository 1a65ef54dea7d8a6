"""Op observers: code that sees every op its thread records, as PyTorch's dispatch modes
see ATen ops. Selective activation checkpointing (which op outputs to keep) and
checkpoint's ``debug=True`` log are built on it, a layer above.

Every differentiable op joins the graph through ``record``, ``record_view`` or
``record_multi`` (``recording.py``), which is where an op's identity (its node class,
``MmBackward0``), its output array(s), its tensor inputs and its parameters are all
known. While an observer is entered on a thread, those functions hand it each op
twice: :meth:`OpObserver.before` with the computed output array(s), which it may
replace by others of the same shape and dtype (a cached output), and
:meth:`OpObserver.after` with the output tensor(s). An op that is expensive to compute
may ask :func:`cached_output` first and skip its computation when an observer already
holds the result.

The hot path pays one global load while no thread observes (``observing[0]``); the
observers themselves are per thread and nest (the outermost sees an op first, as the
mode closest to the kernel does in PyTorch). An observer's own callbacks run with
observation of that thread suspended, so an op it runs is not handed to it again.
"""
import threading

from .grad_mode import ThreadState, thread_state

__all__ = ["OpObserver", "observing", "observe_record", "cached_output"]


class _ObserverState(ThreadState):
    def __init__(self):
        super().__init__(stack=(), suspended=False)


_observers = _ObserverState()
# Observers entered in any thread: record reads the thread-local stack only while this is
# non-zero (the pattern of inference mode's counter).
observing = [0]
_count_lock = threading.Lock()


class OpObserver:
    """Base of op observers; ``with observer:`` observes the ops of this thread.

    Subclasses override :meth:`before`, :meth:`after` and :meth:`lookup`. An object may
    be entered again after it was left (each entry pushes it on this thread's stack).
    """

    def before(self, op, out, inputs, meta):
        """``out`` (an ndarray, or a list of them for multi-output ops) as the op should
        return it: ``out`` itself or a substitute of the same shape and dtype."""
        return out

    def after(self, op, result, inputs, meta):
        """The op's output tensor (a list of tensors for multi-output ops)."""

    def lookup(self, op):
        """An output array this observer will substitute for the next call of ``op``, so
        the op may skip computing it; None when it will not."""
        return None

    def __enter__(self):
        with _count_lock:
            observing[0] += 1
        thread_state(_observers, stack=_observers.stack + (self,)).__enter__()
        return self

    def __exit__(self, *exc):
        thread_state(_observers).__exit__(*exc)
        with _count_lock:
            observing[0] -= 1


def observe_record(record_fn, op, out, args, inputs, meta):
    """``record_fn(op, out, *args)`` as this thread's observers see it (``inputs``: the
    op's tensor inputs, ``meta``: its parameters), or None when this thread observes
    nothing now: the caller then records as usual. Observation stays suspended until the
    op is recorded, so the ``record_fn`` called here records without coming back."""
    stack = _observers.stack
    if not stack or _observers.suspended:
        return None
    with thread_state(_observers, suspended=True):
        for observer in stack:
            out = observer.before(op, out, inputs, meta)
        result = record_fn(op, out, *args)
        for observer in stack:
            observer.after(op, result, inputs, meta)
    return result


def cached_output(op):
    """The output array an observer of this thread will give the next call of ``op``
    (the op may skip computing it), or None."""
    if not observing[0]:
        return None
    stack = _observers.stack
    if not stack or _observers.suspended:
        return None
    for observer in stack:
        found = observer.lookup(op)
        if found is not None:
            return found
    return None

"""What the tests of distributed autograd's on-arrival serving run on workers: small steps
of a chain, steps whose backward runs a user's code (hooks, a custom Function, saved-tensor
hooks, a blocking RPC), a heavy step, and what each worker saw."""
import threading

import numpy as np

import distgrad
from distgrad.autograd.function import Function
from distgrad.autograd.graph import saved_tensors_hooks
from distgrad.distributed import rpc
from distgrad.rpc import current_agent

_threads = []  # names of the threads that ran a user's backward code here


def _note_thread():
    _threads.append(threading.current_thread().name)


def threads_seen():
    """The names noted since the last call (and forget them)."""
    out = list(_threads)
    _threads.clear()
    return out


def collect_garbage(enabled):
    """Turn this worker's garbage collector on or off: a collection that falls in a run of a
    pass's nodes makes it look long (what the on-arrival rule measures)."""
    import gc
    if enabled:
        gc.enable()
    else:
        gc.disable()


def stats():
    """This worker's RPC counters (a Counter: absent ones are 0)."""
    return dict(current_agent().stats)


def scale_on(x, nxt=None):
    """``x * 1.5``, passed on to worker ``nxt`` when given: a link of a chain."""
    y = x * 1.5
    return y if nxt is None else rpc.rpc_sync(nxt, scale_on, (y,))


def hooked(x):
    """A step whose backward runs a tensor hook."""
    y = x * 1.5

    def hook(g):
        _note_thread()
        return g
    y.register_hook(hook)
    return y * 2.0


def _pack(t):
    return t


def _unpack(t):
    _note_thread()
    return t


def with_saved_hooks(x):
    """A step whose saved tensor is unpacked by a user's hook in backward."""
    with saved_tensors_hooks(_pack, _unpack):
        return x * x


class _Echoing(Function):
    """Identity whose backward makes a blocking RPC to ``ctx.other`` (and notes its thread)."""

    @staticmethod
    def forward(ctx, x, other):
        ctx.other = other
        return x * 1.0

    @staticmethod
    def backward(ctx, g):
        _note_thread()
        assert rpc.rpc_sync(ctx.other, threads_seen) is not None
        return g, None


def rpc_in_backward(x, other):
    return _Echoing.apply(x * 1.5, other)


def heavy(x, n):
    """A step whose backward takes milliseconds: (n, n) matrix products."""
    w = distgrad.tensor(np.random.default_rng(0).standard_normal((x.shape[1], n)) / n)
    v = distgrad.tensor(np.random.default_rng(1).standard_normal((n, n)) / n)
    return (x @ w @ v @ v).sum(dim=1)


class _EndOnly:
    def on_backward_end(self):
        pass


class _Closable(_EndOnly):
    closed = []

    def close(self):
        _Closable.closed.append(threading.current_thread().name)


def scale_with_extension(x, closable):
    """``scale_on`` with an extension added to the caller's context here (one with a
    ``close``, as offloading's, or one without, as a launch stage's)."""
    from distgrad.distributed.autograd import container
    cid = container.current_context_id()
    if cid is not None:
        container.add_extension(cid, _Closable() if closable else _EndOnly())
    return scale_on(x)


def closed_on():
    """The threads that closed a closable extension here."""
    return list(_Closable.closed)

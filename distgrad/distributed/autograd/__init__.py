"""``torch.distributed.autograd`` for distgrad: contexts, a distributed backward, gradients.

Inside a running world (a complete program: ``scripts/example_distributed.py``)::

    import distgrad.distributed.autograd as dist_autograd
    with dist_autograd.context() as context_id:
        loss = rpc.rpc_sync("worker1", forward, (x,)).sum()
        dist_autograd.backward(context_id, [loss])
        grads = dist_autograd.get_gradients(context_id)

Leaf gradients of a distributed pass accumulate in the context of each worker
(not in ``.grad``), so passes of several contexts never mix. See ``engine.py`` for
the message flow of a backward and ``container.py`` for the recording of sends/recvs.
"""
from distgrad.autograd._internal import wrap

from . import container as _context
from . import recording as _recording
from . import coordinator as _coordinator
from . import engine as _engine
from . import hooks  # noqa: F401 - cross-process hooks: dist_autograd.hooks.register_*
from .container import DistAutogradContext, current_context_id

__all__ = ["context", "backward", "get_gradients", "DistAutogradContext",
           "debug_live_contexts", "current_context_id", "is_available", "hooks"]


def is_available():
    return True


class context:
    """``with context() as context_id:``: a distributed autograd context on this thread.

    Leaving the block releases the context here and tells every worker that took part,
    without waiting for them (as PyTorch); the release rides along on the next message
    to each, and one not acknowledged within the RPC timeout is logged.
    """

    def __enter__(self):
        _recording.install()  # follows a new agent (init_rpc after shutdown)
        self.context_id = _context.new_context()
        self._scope = _context.scope(self.context_id)
        self._scope.__enter__()
        return self.context_id

    def __exit__(self, exc_type, exc, tb):
        self._scope.__exit__(exc_type, exc, tb)
        _context.release_everywhere(self.context_id)
        return False


class HeldContext:
    """distgrad's own (PyTorch has none): a distributed autograd context held beyond a
    ``with`` block, for a driver that keeps several in flight (``distgrad launch``'s
    autograd strategy sends a step's forwards while the step before it is in its
    backward). It is this thread's current context only inside ``with held.entered():``
    (RPCs made there record in it), so ``with context()`` works meanwhile too;
    ``release()`` ends it as leaving ``with context()`` does (twice is harmless)::

        held = dist_autograd.HeldContext()
        with held.entered():
            out = rpc.rpc_async("worker1", forward, (x,))
        dist_autograd.backward(held.context_id, [out.wait().sum()])
        held.release()
    """

    def __init__(self):
        _recording.install()  # follows a new agent (init_rpc after shutdown)
        with _context.scope(None):  # made outside whatever context this thread is in
            self.context_id = _context.new_context()

    def entered(self):
        return _context.scope(self.context_id)

    def release(self):
        _context.release_everywhere(self.context_id)


def backward(context_id, roots, retain_graph=False):
    """Distributed backward from ``roots`` in context ``context_id`` (this process coordinates)."""
    _coordinator.backward(context_id, roots, retain_graph)


def get_gradients(context_id):
    """{tensor: gradient} of this worker's leaves accumulated in ``context_id``."""
    ctx = _context.require_context(context_id)
    with ctx.lock:
        return {t: wrap(_context.read_only(g)) for t, g in ctx.grads.items()}


def _retrieve_context(context_id):
    return _context.require_context(context_id)


def _current_context():
    cid = _context.current_context_id()
    if cid is None:
        raise RuntimeError("Current thread doesn't have a valid autograd context. Please wrap "
                           "your code using: with torch.distributed.autograd.context() as "
                           "context_id")
    return _context.require_context(cid)


def debug_live_contexts():
    """{worker name: [live context ids]} across the whole RPC world (a debugging aid)."""
    from distgrad.rpc import current_agent
    agent = current_agent()
    if agent is None or not agent.running:
        return {"local": _context.live_context_ids()}
    with _context.scope(None):
        futs = {w.name: agent.call(w.id, _engine.live_contexts) for w in agent.workers}
    return {name: f.wait() for name, f in futs.items()}


_recording.install()

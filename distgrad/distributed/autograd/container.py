"""Distributed autograd contexts: each process's table of them, their leaf gradients and
extensions, and their release everywhere.

Every process keeps its own table of contexts. The send/recv nodes a context's messages
leave are recorded by :mod:`.recording`; they are kept here, per context. Contexts a
peer's messages bring here are checked: the id must name a worker of this world as its
creator, a peer may introduce a bounded number of live contexts, and the contexts of a
creator that died are released (:func:`on_peer_down`).
"""
import collections
import contextlib
import itertools
import logging
import threading
import time

import numpy as np

from distgrad.autograd._internal import sum_grads
from distgrad.rpc import current_agent

from .released import ReleasedIds

__all__ = ["DistAutogradContext", "current_context_id", "get_context", "scope",
           "admit_context", "add_extension", "backward_starts", "backward_ends",
           "release_everywhere", "RELEASE", "on_release_notices", "on_peer_down"]

log = logging.getLogger("distgrad.distributed.autograd")

_RANK_SHIFT = 48
MAX_CONTEXTS_PER_PEER = 10_000  # live contexts one peer's messages may create here
_counter = itertools.count(1)
_lock = threading.Lock()
_contexts = {}
_introduced = collections.Counter()     # peer rank -> live contexts its messages created
# Recently released ids, so that late messages of a released context are ignored instead
# of making it anew; remembered for a while, not forever (released.py).
_RELEASED_KEPT = 100_000  # at most this many ids
_RELEASED_FOR = 120.0     # seconds an id is kept (at least twice the RPC timeout)


class _TLS(threading.local):
    def __init__(self):
        self.current = None     # context id of this thread


_tls = _TLS()


def _agent():
    return current_agent()


def my_rank():
    a = _agent()
    return a.rank if a is not None else 0


def my_name():
    a = _agent()
    return a.name if a is not None else "local"


def new_id():
    return (my_rank() << _RANK_SHIFT) | next(_counter)


def creator_of(context_id):
    """The rank that created a context (or a message id): it is in the id's high bits."""
    return context_id >> _RANK_SHIFT


class DistAutogradContext:
    """One context on one process: its send/recv nodes, known peers, leaf gradients."""

    def __init__(self, context_id, introduced_by=None):
        self.id = context_id
        self.introduced_by = introduced_by  # the peer whose message created it here, if any
        self.lock = threading.Lock()
        self.sends = {}        # msg id -> SendNode (recording.py)
        self.recvs = {}        # msg id -> RecvNode
        self.workers = set()   # names of the peers this process exchanged tensors/calls with
        self.grads = {}        # tensor -> ndarray
        self.passes = {}       # pass id -> running pass on this process
        self.early = {}        # pass id -> gradients that arrived before the pass was set up
        self.aborted = set()   # pass ids abandoned before they were set up here
        # Per-context extensions (saved-tensor hooks, activation offloading, launch stages):
        # entered around every request of the context if they are context managers, told
        # when this process's part of backward starts (on_backward_start) and ends
        # (on_backward_end, see backward_ends), closed on release (close).
        self.extensions = []
        self.extended_peers = set()  # peers told to install extensions for this context

    def _context_id(self):
        return self.id

    def accumulate(self, variable, g, owned=False):
        """Add a leaf's gradient of a pass. As PyTorch's AccumulateGrad, a first gradient is
        taken over when ``owned`` (nothing else refers to it) and contiguous, else copied;
        later ones are summed into a new array. Readers get read-only views
        (get_gradients, DistributedOptimizer), so the array stays the context's."""
        with self.lock:
            old = self.grads.get(variable)
            if old is None and not (owned and _contiguous(g)):
                g = g.copy()
            self.grads[variable] = sum_grads(old, g)


def _contiguous(a):
    """Whether a gradient may be kept as it is: a dense array that is no view, or a sparse
    one whose indices and values are (PyTorch copies a sparse gradient that is not)."""
    if type(a) is np.ndarray:
        return a.flags.c_contiguous and a.base is None
    parts = [getattr(a, "indices", None), getattr(a, "values", None)]
    return all(isinstance(p, np.ndarray) and p.flags.c_contiguous for p in parts)


def read_only(a):
    v = a.view()
    v.flags.writeable = False
    return v


def current_context_id():
    return _tls.current


def get_context(context_id):
    with _lock:
        return _contexts.get(context_id)


def admit_context(context_id, src):
    """The context a message from peer rank ``src`` names, created here if new (None if it
    was released). RuntimeError for an id that names no worker, or past the per-peer bound."""
    agent = _agent()
    world = agent.world_size if agent is not None else 1
    if type(context_id) is not int or context_id <= 0 or not 0 <= creator_of(context_id) < world:
        raise RuntimeError(f"autograd context id {context_id!r} from rank {src} names no worker "
                           "of this world")
    with _lock:
        ctx = _contexts.get(context_id)
        if ctx is None:
            if context_id in _released:
                return None
            if _introduced[src] >= MAX_CONTEXTS_PER_PEER:
                raise RuntimeError(f"rank {src} already brought {MAX_CONTEXTS_PER_PEER} live "
                                   f"autograd contexts here; refusing context {context_id}")
            ctx = _contexts[context_id] = DistAutogradContext(context_id, introduced_by=src)
            _introduced[src] += 1
        return ctx


def require_context(context_id):
    ctx = get_context(context_id)
    if ctx is None:
        raise RuntimeError(f"Could not find autograd context with id: {context_id}")
    return ctx


def new_context():
    if _tls.current is not None:
        raise RuntimeError("Already have an autograd context id for this thread.")
    cid = new_id()
    with _lock:
        _contexts[cid] = DistAutogradContext(cid)
    return cid


def _released_for():
    """Seconds a released context id is remembered: a late message of it arrives within
    the RPC timeout of its release, or its sender gave up on it long before."""
    a = _agent()
    timeout = (a.options.rpc_timeout or 0.0) if a is not None else 0.0
    return max(_RELEASED_FOR, 2 * timeout)


_released = ReleasedIds(_released_for, _RELEASED_KEPT, time.monotonic)


def release_local(context_id):
    """Forget ``context_id`` here; return its context (or None if unknown/released)."""
    with _lock:
        ctx = _contexts.pop(context_id, None)
        if ctx is not None and ctx.introduced_by is not None:
            _introduced[ctx.introduced_by] -= 1
        _released.add(context_id)
    if ctx is not None:
        with ctx.lock:
            passes = list(ctx.passes.values())
            ctx.passes.clear()
            ctx.early.clear()
            extensions, ctx.extensions = ctx.extensions, []
        for ext in extensions:
            _call_extension(ext, "close", context_id)
        for p in passes:
            p.abort(RuntimeError(f"autograd context {context_id} was released during backward"))
        ctx.sends.clear()
        ctx.recvs.clear()
        ctx.grads.clear()
    return ctx


def add_extension(context_id, extension):
    """Attach ``extension`` to ``context_id`` here (see DistAutogradContext.extensions)."""
    ctx = admit_context(context_id, creator_of(context_id))
    if ctx is None:
        raise RuntimeError(f"autograd context {context_id} was released")
    with ctx.lock:
        ctx.extensions.append(extension)
    return ctx


def backward_starts(ctx):
    """This process's part of a backward pass of ``ctx`` is about to start."""
    for ext in list(ctx.extensions):
        _call_extension(ext, "on_backward_start", ctx.id)


def backward_ends(ctx):
    """This process's part of a backward pass of ``ctx`` is complete (every gradient it
    expected arrived and ran): extensions with ``on_backward_end`` run now, before the
    part reports its completion, so what they do (a pipeline stage flushing its deferred
    weight gradients and stepping its optimizer) is done when ``backward`` returns, and
    overlaps the other processes' parts. Unlike the other extension calls, an error here
    fails the part: what it would leave undone must not go unnoticed."""
    for ext in list(ctx.extensions):
        end = getattr(ext, "on_backward_end", None)
        if end is not None:
            end()


def _call_extension(ext, method, context_id):
    fn = getattr(ext, method, None)
    if fn is not None:
        try:
            fn()
        except Exception:  # noqa: BLE001 - an extension must not break the pass or the release
            log.warning("autograd context %s: %s.%s failed", context_id, type(ext).__name__,
                        method, exc_info=True)


def live_context_ids():
    with _lock:
        return sorted(_contexts)


@contextlib.contextmanager
def scope(context_id):
    """Run the block in ``context_id`` (None: in no context, e.g. plain-data messages of
    the distributed engine itself); the one place this thread-local is swapped."""
    prev = _tls.current
    _tls.current = context_id
    try:
        yield
    finally:
        _tls.current = prev


# ---------------------------------------------------------------------- context release
RELEASE = "autograd.release"  # the notice (rpc bookkeeping) that releases a context on a peer


def release_everywhere(context_id, exclude=()):
    """Forget ``context_id`` here and tell every peer that took part, without waiting for
    them (as PyTorch's context release): the release rides along on the next message to
    each peer (or leaves on its own shortly after), and one not acknowledged within the
    RPC timeout is logged. A peer releases in turn on the peers it exchanged with."""
    ctx = release_local(context_id)
    if ctx is None:
        return
    agent = _agent()
    if agent is None or not agent.running:
        return
    timeout = agent.options.rpc_timeout or 60.0
    for peer in sorted(ctx.workers - set(exclude) - {agent.name}):
        rank = agent.worker_info(peer).id
        if agent.unreachable(rank) is None:
            agent.post_notice(rank, RELEASE, context_id, ack=(timeout, _log_unacknowledged))


def on_release_notices(src, context_ids):
    """Notices from ``src``: it released these contexts. They arrive on the I/O thread,
    where most are released at once: dropping a forward's graph and telling the peers
    is quick, and a hand-off to a handler thread on every step of a training loop woke
    a thread that competed for the cores with the next step's work. A context with an
    extension to close (offloading's close removes files) or a pass still running (which
    it aborts) is released on a handler thread."""
    agent = _agent()
    src_name = agent.workers[src].name
    later = []
    for cid in context_ids:
        if type(cid) is not int:
            continue
        if _quick_to_release(cid):
            release_everywhere(cid, exclude={src_name})
        else:
            later.append(cid)
    if later:
        agent.run_soon(_release_all, later, src_name)


def _quick_to_release(context_id):
    with _lock:
        ctx = _contexts.get(context_id)
    if ctx is None:
        return True
    with ctx.lock:
        return not ctx.passes and not any(hasattr(ext, "close") for ext in ctx.extensions)


def _release_all(context_ids, src_name):
    for cid in context_ids:
        release_everywhere(cid, exclude={src_name})


def _log_unacknowledged(rank, kind, context_id):
    """Nobody waits for a release: say which one a peer did not confirm in time."""
    agent = _agent()
    log.warning("releasing autograd context %s on %s: not acknowledged within %.1f s (the "
                "worker is stalled or gone)", context_id, agent.workers[rank].name,
                agent.options.rpc_timeout or 60.0)


def on_peer_down(rank, why, left):
    """The contexts a dead (or departed) worker created cannot be driven any more."""
    with _lock:
        orphans = [cid for cid in _contexts if creator_of(cid) == rank]
    for cid in orphans:
        log.debug("releasing autograd context %s: its creator, rank %d, is gone (%s)", cid,
                  rank, why)
        release_local(cid)

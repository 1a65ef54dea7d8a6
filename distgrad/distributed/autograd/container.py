"""Distributed autograd contexts and the send/recv recording done on every RPC.

Every process keeps its own table of contexts. A tensor that requires grad and
crosses an RPC inside a context leaves a :class:`SendNode` on the sender and a
:class:`RecvNode` on the receiver with the same message id. The message header
also carries, for the message's send nodes and every send node upstream of them,
``[send msg id, owner rank, [recv msg ids reachable from it on its owner]]``: the
coordinator of a backward learns from its own recv nodes which send nodes of the
whole world can still receive a gradient, without a gathering round trip
(the graph below a tensor is complete when it is sent, so this never goes stale).

The recording is an RPC message interceptor (``distgrad.rpc.interceptors``). The
context of a request travels on its :class:`~distgrad.rpc.Request` (``state``),
so a reply produced later by another thread (an ``async_execution`` Future)
still belongs to it. Contexts a peer's messages bring here are checked: the id
must name a worker of this world as its creator, a peer may introduce a bounded
number of live contexts, and the contexts of a creator that died are released.
"""
import collections
import contextlib
import itertools
import logging
import threading
import time
import weakref

import numpy as np

from distgrad.autograd._internal import (Node, array_of, current_graph_task, grad_edge, init_node,
                                         next_sequence_nr, set_history, sum_grads,
                                         task_extension)
from distgrad._tensor import Tensor
from distgrad.rpc import current_agent, entry_point, interceptors

from .released import ReleasedIds

__all__ = ["DistAutogradContext", "SendNode", "RecvNode", "current_context_id", "running_pass",
           "get_context", "install", "scope", "admit_context", "add_extension", "backward_starts",
           "backward_ends",
           "release_everywhere", "RELEASE"]

log = logging.getLogger("distgrad.distributed.autograd")

_RANK_SHIFT = 48
_NAME = "autograd"              # the interceptor's name: its header extra travels under it
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
        self.sends = {}        # msg id -> SendNode
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
    install()
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


def _on_release(src, context_ids):
    """Notices from ``src``: it released these contexts. They arrive on the I/O thread,
    where most are released at once: dropping a forward's graph and telling the peers
    is quick, and a hand-off to a handler thread on every step of a training loop woke
    a thread that competed for the cores with the next step's work. A context with an
    extension to close (offloading's close removes files) or a pass still running (which
    it aborts) is released on a handler thread."""
    agent = _agent()
    ids = [cid for cid in context_ids if type(cid) is int]
    src_name = agent.workers[src].name
    later = [cid for cid in ids if not _quick_to_release(cid)]
    for cid in ids:
        if cid not in later:
            release_everywhere(cid, exclude={src_name})
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


# ---------------------------------------------------------------------- graph nodes
class SendNode(Node):
    """Root of this process's segment for one tensor it sent: passes its gradient on."""

    __slots__ = ("msg_id", "dst", "freed")

    def __init__(self, tensor, msg_id, dst):
        a = array_of(tensor)
        init_node(self, (grad_edge(tensor),), next_sequence_nr(), ((a.shape, a.dtype),))
        self.msg_id, self.dst, self.freed = msg_id, dst, False

    def name(self):
        return "SendRpcBackward"

    def apply(self, grads):
        return (grads[0],)


# Below the leaves' (which accumulate locally and may have hooks), above every op's.
SHIP_FIRST_SEQUENCE_NR = 1 << 61


class RecvNode(Node):
    """``grad_fn`` of a tensor that arrived over RPC: ships its gradient to the sender."""

    __slots__ = ("msg_id", "src", "src_rank", "context_id", "upstream")
    _materialize_grads = True  # runs even with a None gradient: the sender counts on a message

    def __init__(self, tensor, msg_id, src, src_rank, context_id, upstream):
        # It only ships a gradient to another process: run it as soon as it is ready, as
        # a leaf runs, so the sender's backward of that micro-batch overlaps with this
        # process's backward of the next. With the number of when its tensor arrived it
        # waited behind compute of later-arriving micro-batches (the 2-stage pipeline of
        # bench_rpc_pipeline ran its stages' backward one after the other).
        a = array_of(tensor)
        init_node(self, (), SHIP_FIRST_SEQUENCE_NR, ((a.shape, a.dtype),))
        self.msg_id, self.src, self.src_rank = msg_id, src, src_rank
        self.context_id, self.upstream = context_id, upstream

    def name(self):
        return "RecvRpcBackward"

    def apply(self, grads):
        dist_pass = running_pass()
        if dist_pass is None:
            raise RuntimeError("a tensor received over RPC inside a distributed autograd context "
                               "can only be differentiated with "
                               "distgrad.distributed.autograd.backward")
        if dist_pass.ctx.id == self.context_id:  # a recv of another context leads nowhere here
            dist_pass.ship(self, grads[0])
        return ()


def running_pass():
    """The distributed backward pass (``engine._Pass``) this thread runs, kept in the local
    engine's extensions; None outside one."""
    return task_extension(current_graph_task(), "distributed")


def reachable_recvs(node, context_id):
    """RecvNodes of ``context_id`` reachable from ``node`` in this process's graph."""
    found, seen, stack = [], {node}, [node]
    while stack:
        n = stack.pop()
        if type(n) is RecvNode:
            if n.context_id == context_id:
                found.append(n)
            continue
        for nxt, _ in n.next_functions:
            if nxt is not None and nxt not in seen:
                seen.add(nxt)
                stack.append(nxt)
    return found


# ---------------------------------------------------------------------- payload walking
def _grad_tensors(obj, out):
    t = type(obj)
    if t is Tensor or isinstance(obj, Tensor):
        if obj.requires_grad:
            out.append(obj)
    elif t is list or t is tuple:
        for x in obj:
            _grad_tensors(x, out)
    elif t is dict:
        for x in obj.values():
            _grad_tensors(x, out)
    return out


# ---------------------------------------------------------------------- the interceptor
_install_lock = threading.Lock()
_installed_on = set()     # ranks known to run the interceptor, for the agent below
_installed_agent = [None]


@entry_point
def _installed():
    """Runs on a peer before it reads a message of a context (``installer_for``): the
    interceptor is installed there (importing this module, if it was not yet)."""
    install()
    return True


_INSTALLER = f"{__name__}:_installed"


def _knows(rank):
    """Whether peer ``rank`` is known to run the interceptor (it sent or answered a message
    of a context)."""
    agent = _agent()
    return _installed_agent[0] is agent and rank in _installed_on


def _learn(rank):
    """Peer ``rank`` runs the interceptor."""
    agent = _agent()
    with _install_lock:
        if _installed_agent[0] is not agent:
            _installed_on.clear()
            _installed_agent[0] = agent
        _installed_on.add(rank)


def _parse(extra, who):
    """(context id, send ids, upstream info) of a header extra; RuntimeError if malformed."""
    if type(extra) is list and len(extra) == 3 and type(extra[0]) is int \
            and type(extra[1]) is list and all(type(i) is int for i in extra[1]) \
            and type(extra[2]) is list and all(
                type(e) is list and len(e) == 3 and type(e[0]) is int and type(e[1]) is int
                and type(e[2]) is list and all(type(i) is int for i in e[2]) for e in extra[2]):
        return extra
    raise RuntimeError(f"malformed distributed autograd header from {who!r}")


def _record_sends(cid, dst, payload):
    """SendNodes for the tensors of ``payload`` going to ``dst``: the header extra."""
    ctx = get_context(cid)
    if ctx is None:
        return None
    ctx.workers.add(dst.name)
    tensors = _grad_tensors(payload, [])
    if not tensors:
        return [cid, [], []]
    me = _agent().rank
    ids, info = [], {}
    for t in tensors:
        mid = new_id()
        node = SendNode(t, mid, dst.name)
        recvs = reachable_recvs(node, cid)
        for r in recvs:
            for entry in r.upstream:
                info.setdefault(entry[0], entry)
        info[mid] = [mid, me, [r.msg_id for r in recvs]]
        with ctx.lock:
            ctx.sends[mid] = node
        ids.append(mid)
    return [cid, ids, list(info.values())]


def _record_recvs(ctx, src, ids, info, payload):
    """RecvNodes for the tensors of ``payload`` that came from ``src`` (WorkerInfo)."""
    ctx.workers.add(src.name)
    if not ids:
        return
    tensors = _grad_tensors(payload, [])
    if len(tensors) != len(ids):
        raise RuntimeError(f"distributed autograd: message from {src.name!r} announced "
                           f"{len(ids)} tensors that require grad, found {len(tensors)}")
    for t, mid in zip(tensors, ids):
        node = RecvNode(t, mid, src.name, src.id, ctx.id, info)
        set_history(t, node)
        with ctx.lock:
            ctx.recvs[mid] = node


class _Interceptor:
    """Records send/recv nodes on every message of a context; see the module doc."""

    def on_send_request(self, dst, args, kwargs):
        cid = _tls.current
        if cid is None:
            return args, kwargs, None
        return args, kwargs, _record_sends(cid, dst, (args, kwargs))

    def installer_for(self, dst):
        # until ``dst`` showed it runs the interceptor, a message of a context asks it to
        # install it first (no round trip of its own, as a call of ``_installed`` was)
        return None if _knows(dst.id) or dst.id == my_rank() else _INSTALLER

    def on_receive_request(self, request, args, kwargs):
        extra = request.extra(_NAME)
        if extra is None:
            return args, kwargs
        if not _knows(request.src):
            _learn(request.src)
        cid, ids, info = _parse(extra, request.worker.name)
        ctx = admit_context(cid, request.src)
        if ctx is not None:
            request.state[_NAME] = cid
            _record_recvs(ctx, request.worker, ids, info, (args, kwargs))
        return args, kwargs

    def request_scope(self, request):
        return _RequestScope(request.state.get(_NAME))

    def on_send_response(self, request, value):
        cid = request.state.get(_NAME)
        if cid is None:
            return value, None
        return value, _record_sends(cid, request.worker, value)

    def on_receive_response(self, src, extra, value):
        if extra is None:
            return value
        if not _knows(src.id):
            _learn(src.id)  # it answered a message of a context: it installed the interceptor
        cid, ids, info = _parse(extra, src.name)
        ctx = get_context(cid)
        if ctx is not None:  # released meanwhile: the tensors stay plain leaves
            _record_recvs(ctx, src, ids, info, value)
        return value


class _RequestScope:
    """The handler of a request runs in the sender's context, inside its extensions."""
    __slots__ = ("cid", "scope", "entered")

    def __init__(self, cid):
        self.cid = cid
        self.entered = []

    def __enter__(self):
        self.scope = scope(self.cid)
        self.scope.__enter__()
        ctx = get_context(self.cid) if self.cid is not None else None
        for ext in list(ctx.extensions) if ctx is not None else ():
            if hasattr(ext, "__enter__"):
                ext.__enter__()
                self.entered.append(ext)
        return self

    def __exit__(self, *exc):
        for ext in reversed(self.entered):
            ext.__exit__(*exc)
        self.scope.__exit__(*exc)
        return False


def _on_peer_down(rank, why, left):
    """The contexts a dead (or departed) worker created cannot be driven any more."""
    with _lock:
        orphans = [cid for cid in _contexts if creator_of(cid) == rank]
    for cid in orphans:
        log.debug("releasing autograd context %s: its creator, rank %d, is gone (%s)", cid,
                  rank, why)
        release_local(cid)


_interceptor = _Interceptor()
_listening = [lambda: None]  # weak reference to the agent told about _on_peer_down


def install():
    """Make this process record distributed autograd (idempotent; follows a new agent)."""
    interceptors.add(_interceptor, name=_NAME)
    agent = _agent()
    if agent is not None and _listening[0]() is not agent:
        with _install_lock:
            if _listening[0]() is not agent:
                agent.add_peer_listener(_on_peer_down)
                agent.bookkeeping.register(RELEASE, _on_release, acknowledge=True)
                _listening[0] = weakref.ref(agent)

"""Distributed autograd contexts and the send/recv recording done on every RPC.

Every process keeps its own table of contexts. A tensor that requires grad and
crosses an RPC inside a context leaves a :class:`SendNode` on the sender and a
:class:`RecvNode` on the receiver with the same message id. The message header
also carries, for the message's send nodes and every send node upstream of them,
``[send msg id, owner rank, [recv msg ids reachable from it on its owner]]``: the
coordinator of a backward learns from its own recv nodes which send nodes of the
whole world can still receive a gradient, without a gathering round trip
(the graph below a tensor is complete when it is sent, so this never goes stale).
"""
import collections
import contextlib
import itertools
import threading

from distgrad.autograd.node import Node
from distgrad.autograd.tensor import Tensor
from distgrad.rpc import agent as _agent_mod

__all__ = ["DistAutogradContext", "SendNode", "RecvNode", "current_context_id",
           "get_context", "install"]

_RANK_SHIFT = 48
_counter = itertools.count(1)
_lock = threading.Lock()
_contexts = {}
_released = collections.OrderedDict()  # recently released ids: late messages are ignored
_RELEASED_KEPT = 100_000


class _TLS(threading.local):
    def __init__(self):
        self.current = None     # context id of this thread
        self.reply_ctx = None   # context of the request whose reply this thread sends next


_tls = _TLS()


def _agent():
    return _agent_mod.current_agent()


def my_rank():
    a = _agent()
    return a.rank if a is not None else 0


def my_name():
    a = _agent()
    return a.name if a is not None else "local"


def new_id():
    return (my_rank() << _RANK_SHIFT) | next(_counter)


class DistAutogradContext:
    """One context on one process: its send/recv nodes, known peers, leaf gradients."""

    def __init__(self, context_id):
        self.id = context_id
        self.lock = threading.Lock()
        self.sends = {}        # msg id -> SendNode
        self.recvs = {}        # msg id -> RecvNode
        self.workers = set()   # names of the peers this process exchanged tensors/calls with
        self.grads = {}        # tensor -> ndarray
        self.passes = {}       # pass id -> running pass on this process
        self.early = {}        # pass id -> gradients that arrived before the pass was set up
        self.aborted = set()   # pass ids abandoned before they were set up here
        self.hooks = {}        # extension slot: per-context hooks (saved tensors, ...)

    def _context_id(self):
        return self.id

    def accumulate(self, variable, g):
        # No copy: the engine never writes into a gradient it passed on, and readers get
        # read-only views (get_gradients, DistributedOptimizer), so the array stays ours.
        with self.lock:
            old = self.grads.get(variable)
            self.grads[variable] = g if old is None else old + g


def read_only(a):
    v = a.view()
    v.flags.writeable = False
    return v


def current_context_id():
    return _tls.current


def get_context(context_id, create=False):
    with _lock:
        ctx = _contexts.get(context_id)
        if ctx is None and create and context_id not in _released:
            ctx = _contexts[context_id] = DistAutogradContext(context_id)
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


def release_local(context_id):
    """Forget ``context_id`` here; return its context (or None if unknown/released)."""
    with _lock:
        ctx = _contexts.pop(context_id, None)
        _released[context_id] = True
        while len(_released) > _RELEASED_KEPT:
            _released.popitem(last=False)
    if ctx is not None:
        with ctx.lock:
            passes = list(ctx.passes.values())
            ctx.passes.clear()
            ctx.early.clear()
        for p in passes:
            p.abort(RuntimeError(f"autograd context {context_id} was released during backward"))
        ctx.sends.clear()
        ctx.recvs.clear()
        ctx.grads.clear()
    return ctx


def live_context_ids():
    with _lock:
        return sorted(_contexts)


@contextlib.contextmanager
def scope(context_id):
    prev = _tls.current
    _tls.current = context_id
    try:
        yield
    finally:
        _tls.current = prev


# ---------------------------------------------------------------------- graph nodes
class SendNode(Node):
    """Root of this process's segment for one tensor it sent: passes its gradient on."""

    __slots__ = ("msg_id", "dst", "freed")

    def __init__(self, tensor, msg_id, dst):
        super().__init__()
        self.msg_id, self.dst, self.freed = msg_id, dst, False
        self._next = (tensor._grad_edge(),)
        self._out_meta = ((tensor._data.shape, tensor._data.dtype),)

    def name(self):
        return "SendRpcBackward"

    def apply(self, grads):
        return (grads[0],)


class RecvNode(Node):
    """``grad_fn`` of a tensor that arrived over RPC: ships its gradient to the sender."""

    __slots__ = ("msg_id", "src", "src_rank", "context_id", "upstream")
    _materialize_grads = True  # runs even with a None gradient: the sender counts on a message

    def __init__(self, tensor, msg_id, src, src_rank, context_id, upstream):
        super().__init__()
        self.msg_id, self.src, self.src_rank = msg_id, src, src_rank
        self.context_id, self.upstream = context_id, upstream
        self._out_meta = ((tensor._data.shape, tensor._data.dtype),)

    def name(self):
        return "RecvRpcBackward"

    def apply(self, grads):
        from distgrad.autograd.engine import current_graph_task
        task = current_graph_task()
        dist_pass = getattr(task, "dist_pass", None)
        if dist_pass is None:
            raise RuntimeError("a tensor received over RPC inside a distributed autograd context "
                               "can only be differentiated with "
                               "distgrad.distributed.autograd.backward")
        if dist_pass.ctx.id == self.context_id:  # a recv of another context leads nowhere here
            dist_pass.ship(self, grads[0])
        return ()


def reachable_recvs(node, context_id):
    """RecvNodes of ``context_id`` reachable from ``node`` in this process's graph."""
    found, seen, stack = [], {node}, [node]
    while stack:
        n = stack.pop()
        if type(n) is RecvNode:
            if n.context_id == context_id:
                found.append(n)
            continue
        for nxt, _ in n._next:
            if nxt is not None and nxt not in seen:
                seen.add(nxt)
                stack.append(nxt)
    return found


# ---------------------------------------------------------------------- payload walking
def _grad_tensors(obj, out):
    t = type(obj)
    if t is Tensor or isinstance(obj, Tensor):
        if obj._requires_grad:
            out.append(obj)
    elif t is list or t is tuple:
        for x in obj:
            _grad_tensors(x, out)
    elif t is dict:
        for x in obj.values():
            _grad_tensors(x, out)
    return out


# ---------------------------------------------------------------------- the interceptor
_installed_on = set()   # ranks known to run the interceptor, for the agent below
_installed_agent = [None]
_install_lock = threading.Lock()


def _installed():
    """Runs on a peer: importing this module installed the interceptor there."""
    install()
    return True


class _Interceptor:
    def on_send(self, kind, dst_name, payload):
        if kind == "request":
            cid = _tls.current
        else:
            cid, _tls.reply_ctx = _tls.reply_ctx, None
        if cid is None:
            return payload, None
        ctx = get_context(cid)
        if ctx is None:
            return payload, None
        agent = _agent()
        if kind == "request":
            dst = agent.worker_info(dst_name).id
            if dst not in _installed_on or _installed_agent[0] is not agent:
                _ensure_installed(agent, dst)
        ctx.workers.add(dst_name)
        tensors = _grad_tensors(payload, [])
        if not tensors:
            return payload, [cid, [], []]
        me = agent.rank
        ids, info = [], {}
        for t in tensors:
            mid = new_id()
            node = SendNode(t, mid, dst_name)
            recvs = reachable_recvs(node, cid)
            for r in recvs:
                for entry in r.upstream:
                    info.setdefault(entry[0], entry)
            info[mid] = [mid, me, [r.msg_id for r in recvs]]
            with ctx.lock:
                ctx.sends[mid] = node
            ids.append(mid)
        return payload, [cid, ids, list(info.values())]

    def on_receive(self, kind, src_name, extra, payload):
        if type(extra) is not list or len(extra) != 3:
            return payload
        cid, ids, info = extra
        if not ids:
            return payload
        ctx = get_context(cid, create=(kind == "request"))
        if ctx is None:  # released: the tensors stay plain leaves
            return payload
        ctx.workers.add(src_name)
        tensors = _grad_tensors(payload, [])
        if len(tensors) != len(ids):
            raise RuntimeError(f"distributed autograd: message from {src_name!r} announced "
                               f"{len(ids)} tensors that require grad, found {len(tensors)}")
        src_rank = _agent().worker_info(src_name).id
        for t, mid in zip(tensors, ids):
            node = RecvNode(t, mid, src_name, src_rank, cid, info)
            t._grad_fn = node
            t._output_nr = 0
            with ctx.lock:
                ctx.recvs[mid] = node
        return payload

    def request_scope(self, src_name, extra):
        cid = None
        if type(extra) is list and len(extra) == 3:
            cid = extra[0]
            if get_context(cid, create=True) is None:
                cid = None
            else:
                get_context(cid).workers.add(src_name)
        return _RequestScope(cid)


class _RequestScope:
    """The handler of a request runs in the sender's context (and its saved-tensor hooks)."""
    __slots__ = ("cid", "prev", "saved")

    def __init__(self, cid):
        self.cid = cid
        self.saved = None

    def __enter__(self):
        self.prev = _tls.current
        _tls.current = self.cid
        _tls.reply_ctx = None
        if self.cid is not None:
            ctx = get_context(self.cid)
            pair = ctx.hooks.get("saved") if ctx is not None else None
            if pair is not None:
                from distgrad.autograd.saved import hooks_state
                hooks_state.stack.append(pair)
                self.saved = hooks_state

    def __exit__(self, *exc):
        if self.saved is not None:
            self.saved.stack.pop()
        _tls.current = self.prev
        _tls.reply_ctx = self.cid
        return False


def _ensure_installed(agent, dst):
    if dst == agent.rank:
        return
    with _install_lock:
        if _installed_agent[0] is not agent:
            _installed_on.clear()
            _installed_agent[0] = agent
        if dst in _installed_on:
            return
        prev = _tls.current
        _tls.current = None  # the install call itself belongs to no context
        try:
            agent.call_sync(dst, _installed, (), None)
        finally:
            _tls.current = prev
        _installed_on.add(dst)


_interceptor = _Interceptor()


def install():
    if _agent_mod.get_message_interceptor() is not _interceptor:
        _agent_mod.set_message_interceptor(_interceptor)

"""The send/recv recording done on every RPC of a distributed autograd context.

A tensor that requires grad and crosses an RPC inside a context leaves a
:class:`SendNode` on the sender and a :class:`RecvNode` on the receiver with the same
message id, both kept in the context (:mod:`.container`). The message header also
carries, for the message's send nodes and every send node upstream of them,
``[send msg id, owner rank, [recv msg ids reachable from it on its owner]]``: the
coordinator of a backward learns from its own recv nodes which send nodes of the whole
world can still receive a gradient, without a gathering round trip (the graph below a
tensor is complete when it is sent, so this never goes stale).

The recording is an RPC message interceptor (``distgrad.rpc.interceptors``). The
context of a request travels on its :class:`~distgrad.rpc.Request` (``state``), so a
reply produced later by another thread (an ``async_execution`` Future) still belongs to
it.
"""
import threading
import weakref

from distgrad._tensor import Tensor
from distgrad.autograd._internal import (Node, array_of, current_graph_task, grad_edge,
                                         init_node, next_sequence_nr, set_history,
                                         task_extension)
from distgrad.rpc import current_agent, entry_point, interceptors

from .container import (RELEASE, admit_context, current_context_id, get_context, my_rank,
                        new_id, on_peer_down, on_release_notices, scope)

__all__ = ["SendNode", "RecvNode", "running_pass", "reachable_recvs", "install"]

_NAME = "autograd"  # the interceptor's name: its header extra travels under it


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
    agent = current_agent()
    return _installed_agent[0] is agent and rank in _installed_on


def _learn(rank):
    """Peer ``rank`` runs the interceptor."""
    agent = current_agent()
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
    me = current_agent().rank
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
        cid = current_context_id()
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
        cid = request.state.get(_NAME)
        if cid is None and current_context_id() is None:
            return None  # no context to enter, none to leave: nothing to do around it
        return _RequestScope(cid)

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


_interceptor = _Interceptor()
_listening = [lambda: None]  # weak reference to the agent told about on_peer_down


def install():
    """Make this process record distributed autograd (idempotent; follows a new agent)."""
    interceptors.add(_interceptor, name=_NAME)
    agent = current_agent()
    if agent is not None and _listening[0]() is not agent:
        with _install_lock:
            if _listening[0]() is not agent:
                agent.add_peer_listener(on_peer_down)
                agent.bookkeeping.register(RELEASE, on_release_notices, acknowledge=True)
                _listening[0] = weakref.ref(agent)

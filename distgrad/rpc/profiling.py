"""RPC under the profiler: what a profiled caller runs on other workers joins its profile.

PyTorch's RPC profiling reports, for each remote call, only totals of the ops the callee
ran. Here the callee's work is recorded in full and sent to the profile's owner, so its
table has those events (with the callee's ``node_id``) and its trace has the callee as a
process of its own, with an arrow from each send to where the request was served.

How: a request made by a profiled thread carries the profile's *session* in its header
(an interceptor extra: session id, flow id, recording options, owner rank, event name).
The handler of such a request records into that session's recorder on its process
(made on the first request, see ``autograd/profiling.py``); calls it makes carry the
session on, so a nested call's or a distributed backward's work is recorded wherever
it runs. The caller records ``<how>#<function>(<caller> -> <callee>)`` from the send to
the reply (PyTorch's name), the callee the same name around serving it. When the
owner's profile stops, it collects every session it reached (``@profiler.collect``,
worker by worker, following whom each one called): nothing travels while recording.
"""
import itertools
import os
import socket
import sys
import threading

from ..autograd import profiling
from . import interceptors
from .current import current_agent
from .dispatch import add_internal_op

__all__ = ["MAX_SESSION_EVENTS"]

_NAME = "profiler"
_COLLECT = "@profiler.collect"
_OPTIONS = (("record_shapes", 1), ("profile_memory", 2), ("with_stack", 4), ("with_flops", 8))
#: Events a peer's session may hold here; requests beyond that are served unrecorded.
MAX_SESSION_EVENTS = 1_000_000
MAX_PENDING = 100_000  # calls of profiled threads waiting for their reply, process-wide
_MAX_NAME = 512
_flows = itertools.count(1)
_pending = {}  # flow id -> (recorder, event name, start ns, thread id, rank called)
_lock = threading.Lock()


def _display(what):
    """PyTorch's name of a called function: an op's (``aten::add``), else its qualified name."""
    module, _, qualname = what.partition(":")
    fn = sys.modules.get(module)
    for part in qualname.split("."):
        fn = getattr(fn, part, None)
    return getattr(fn, "__profiler_name__", None) or f"{module}.{qualname}"


def _options(rec):
    return sum(bit for name, bit in _OPTIONS if getattr(rec, name))


class _Serving:
    """The scope of a request of a profiled caller: this thread records into its session."""

    __slots__ = ("request", "session", "flow", "options", "owner", "name", "token", "rec",
                 "begin", "tid")

    def __init__(self, request, session, flow, options, owner, name):
        self.request, self.session, self.flow = request, session, flow
        self.options, self.owner, self.name = options, owner, name
        self.token = None

    def __enter__(self):
        rec = profiling.session(self.session)
        if rec is None:
            rec = profiling.open_session(self.session, self.owner,
                                         {name: bool(self.options & bit) for name, bit in _OPTIONS})
        if rec is None or rec.closed or len(rec.events) > MAX_SESSION_EVENTS:
            return self
        self.rec, self.token = rec, profiling.attach(rec)
        self.request.state[_NAME] = self.flow  # the reply says which call it answers
        self.begin, self.tid = rec.mark(), profiling.thread_id()
        rec.flow(profiling.FLOW_IN, self.flow)  # (after the span's start: the arrow ends in it)
        return self

    def __exit__(self, *exc):
        if self.token is not None:
            self.rec.span(profiling.HANDLER, self.name, self.begin, self.tid)
            profiling.detach(self.token)
            self.token = None
        return False


class _Interceptor:
    def on_send_call(self, dst, what, how):
        rec = profiling.current()
        if rec is None or what.startswith("@"):
            return None
        agent = current_agent()
        rank = agent.rank if agent is not None else 0
        flow = ((rank + 1) << 40) | next(_flows)  # unique in the world: ranks' own ranges
        name = f"{how}#{_display(what)}({agent.name if agent else '?'} -> {dst.name})"
        rec.peers.add(dst.id)
        start = profiling.now()
        rec.flow(profiling.FLOW_OUT, flow)  # (after the call's start: the arrow leaves it)
        if how != "notify":
            with _lock:
                if len(_pending) < MAX_PENDING:
                    _pending[flow] = (rec, name, start, profiling.thread_id(), dst.id)
        owner = rank if rec.origin is None else rec.origin
        return [rec.session, flow, _options(rec), owner, name]

    def request_scope(self, request):
        extra = request.extra(_NAME)
        if type(extra) is not list or len(extra) != 5:
            return None  # not profiled (or malformed: served, unrecorded)
        session, flow, options, owner, name = extra
        if not (type(session) is int and type(flow) is int and type(options) is int
                and type(owner) is int and type(name) is str and len(name) <= _MAX_NAME):
            return None
        return _Serving(request, session, flow, options, owner, name)

    def on_send_response(self, request, value):
        return value, request.state.get(_NAME)

    def on_receive_response(self, src, extra, value):
        if type(extra) is int:
            with _lock:  # (only a reply from the rank called ends the call's event)
                call = _pending.get(extra)
                if call is not None and call[4] == src.id:
                    del _pending[extra]
                else:
                    call = None
            if call is not None:
                rec, name, start, tid, _ = call
                rec.add(profiling.RPC, name, start, profiling.now(), tid, extra)
        return value


def _process(rec, agent):
    return {"pid": os.getpid(), "host": socket.gethostname(), "name": agent.name,
            "rank": agent.rank, "threads": sorted(rec.threads.values())}


def _drop_pending(rec):
    """Forget the calls of ``rec``'s threads still waiting for a reply (it is stopping)."""
    with _lock:
        for flow in [f for f, call in _pending.items() if call[0] is rec]:
            del _pending[flow]


def _serve_collect(request, session):
    """``@profiler.collect``: a peer's session here, for its owner: [process, events, ranks
    it called, notes]; the session is closed (later requests of it are not recorded)."""
    rec = profiling.session(session)
    if rec is None or rec.origin is None or rec.origin != request.src:
        return None
    busy = profiling.settle(rec)  # handlers that replied and are finishing: wait for them
    profiling.close_session(session)
    _drop_pending(rec)
    notes = [f"{busy} thread(s) still served requests of the profile when it stopped: what "
             "they did next is not in it"] if busy else []
    return [_process(rec, current_agent()), rec.finish(), sorted(rec.peers), notes]


def _well_formed(reply):
    if type(reply) is not list or len(reply) != 4:
        return False
    proc, events, peers, notes = reply
    return type(proc) is dict and type(events) is list and type(peers) is list and \
        type(notes) is list and all(type(n) is str for n in notes) and all(
        type(e) is list and len(e) == 7 and type(e[0]) is int and type(e[2]) is int
        and type(e[3]) is int and type(e[4]) is int for e in events)


def _collect(rec):
    """At the stop of a profile of this process: bring in what its sessions recorded."""
    if rec.origin is not None:
        return
    _drop_pending(rec)  # unanswered (failed, timed out, or still running)
    agent = current_agent()
    if agent is None or not agent.running:
        if rec.peers:
            rec.warnings.append("the profile's RPC calls reached other workers, but RPC is "
                                "not running any more: their events are not in the profile")
        return
    rec.identity = {"name": agent.name, "rank": agent.rank}
    todo, seen = sorted(rec.peers), {agent.rank}
    while todo:
        rank = todo.pop(0)
        if rank in seen:
            continue
        seen.add(rank)
        try:
            reply = agent.call_sync(rank, _COLLECT, (rec.session,))
        except Exception as e:  # noqa: BLE001 - the profile is still worth having
            rec.warnings.append(f"the profile's events on {agent.describe(rank)} could not be "
                                f"collected: {type(e).__name__}: {e}")
            continue
        if reply is None:
            continue
        if not _well_formed(reply):
            rec.warnings.append(f"{agent.describe(rank)} sent malformed profile events: "
                                "left out")
            continue
        proc, events, peers, notes = reply
        rec.warnings += [f"{agent.describe(rank)}: {note}" for note in notes]
        proc["threads"] = {tid: name for tid, name in proc.get("threads", ())}
        rec.remote.append((proc, events))
        todo += [p for p in peers if type(p) is int and p not in seen]


interceptors.add(_Interceptor(), name=_NAME)
add_internal_op(_COLLECT, _serve_collect)
profiling.add_collector(_collect)

"""The profiler's hook in the engine and the ops: where events are recorded.

A :class:`Recorder` collects the events of one profile (``distgrad.profiler.profile``,
``distgrad.autograd.profiler.profile``) or, on a peer, of one profile's RPC session. A
thread records into the recorder attached to it (:func:`attach`), as PyTorch's profiler
records the thread that enabled it: other threads are not profiled unless they serve a
profiled RPC request (``distgrad/rpc/profiling.py`` attaches them for its duration).

The cost when nothing is profiled is one check of a module global (:data:`_active`, the
number of threads recording anywhere in the process): in every op wrapped by
:func:`observed` (``distgrad/ops/op_names.py`` wraps the op table) and once per backward
pass in the engine (:func:`current`).

Events are raw tuples ``(kind, name, start_ns, end_ns, tid, seq, extra)`` (clock:
``perf_counter_ns``; ``seq`` is the sequence number, or the flow id of RPC and flow
events; ``extra`` None or a dict of what the options asked for). They become
:class:`~distgrad.autograd.profiler_util.FunctionEvent` objects once the profile stops
(``profiler_results.py``), as PyTorch post-processes its records.
"""
import functools
import random
import threading
import time
import tracemalloc

from . import node as _node, profiler_inputs as _inputs, profiler_python as _python
from .tensor import TensorBase

__all__ = ["Recorder", "observed", "attach", "detach", "current", "thread_id", "now",
           "add_collector", "collect", "register", "unregister", "settle", "session",
           "open_session", "close_session", "peer_sessions", "OP", "EVAL", "NODE", "USER",
           "PY", "RPC", "HANDLER", "FLOW_OUT", "FLOW_IN", "PAIR", "NO_SEQ_FROM"]

# kinds of raw events (PAIR: a backward node's EVAL and NODE events in one, see node_ran)
OP, EVAL, NODE, USER, PY, RPC, HANDLER, FLOW_OUT, FLOW_IN, PAIR = range(10)

# Sequence numbers at or above this are not ops' (leaves', RPC receivers'): PyTorch shows -1.
NO_SEQ_FROM = 1 << 61
EVALUATE = "autograd::engine::evaluate_function: "
ACCUMULATE = "torch::autograd::AccumulateGrad"
# PyTorch's C++ nodes are named by their qualified C++ class names
_CPP_NODES = {"AccumulateGrad": ACCUMULATE,
              "SendRpcBackward": "torch::distributed::autograd::SendRpcBackward",
              "RecvRpcBackward": "torch::distributed::autograd::RecvRpcBackward"}
_NODE_NAMES = {}  # node.name() -> (PyTorch's name, its evaluate_function event's name)

now = time.perf_counter_ns
_traced = tracemalloc.get_traced_memory

#: Threads recording in this process; read unlocked by every wrapped op (the one check).
_active = 0
_lock = threading.Lock()
_detached = threading.Condition(_lock)  # a recorder's last thread detached
_memory_users = [0, False]  # recorders that profile memory; whether we started tracemalloc


# thread ident -> the Recorder that thread records into. A dict read without the lock
# (one lookup under the GIL) costs less than a thread-local on the hot paths.
_recorders = {}
thread_id = threading.get_ident  # what events name their thread by (native ids in results)


def current():
    """The recorder of this thread when it records (one global check when nothing does)."""
    if not _active:
        return None
    rec = _recorders.get(thread_id())
    return rec if rec is not None and rec.enabled else None


class Recorder:
    """The events of one profile on this process, or of one peer's profile session here.

    ``session`` is the id under which requests of this profile travel (made up when
    None); ``origin`` names whose session a peer's recorder serves (None: this process's
    own profile).
    """

    def __init__(self, record_shapes=False, profile_memory=False, with_stack=False,
                 with_flops=False, session=None, origin=None):
        self.record_shapes, self.profile_memory = record_shapes, profile_memory
        self.with_stack, self.with_flops = with_stack, with_flops
        self.detailed = record_shapes or profile_memory or with_flops
        self.session = session if session is not None else random.getrandbits(62) + 1
        self.origin = origin
        self.events = []
        self.enabled = True
        self.threads = {}        # thread ident -> (native id, name)
        self.in_op = set()       # idents of threads inside a recorded op
        self.peers = set()       # ranks that got requests of this session from here
        self.remote = []         # [(process description, portable events)] from peers
        self.warnings = []       # what could not be collected, said when results are built
        self.closed = False
        self.attached = 0        # threads recording into it now
        self.identity = None     # this process's worker {"name", "rank"}, when it is one
        self.start_ns = now()
        self.clock_offset = time.time_ns() - self.start_ns  # to epoch ns, for other processes
        self.start_seq = _node.peek_sequence_nr()
        # mark(): a point in time: the time (the clock itself, no call of ours: it is on
        # every node's path), and with the detailed options (time, traced memory)
        self.mark = self._mark_detailed if self.detailed else now
        if profile_memory:
            _memory_in()

    # -- recording (hot paths) --
    def call(self, name, fn, args, kwargs, tid):
        """``fn(*args, **kwargs)`` as op ``name`` on thread ``tid``: one event around it.
        The ops it calls are its own business (composites, shared helpers): their time is
        its self time, as a fused kernel's would be, and they record nothing (``in_op``)."""
        extra = self._describe(name, args, kwargs) if self.detailed else None
        busy = self.in_op
        busy.add(tid)
        start = now()
        out = None
        try:
            out = fn(*args, **kwargs)
            return out
        finally:
            end = now()
            busy.discard(tid)
            if extra is not None and self.profile_memory:
                extra["mem"] = _traced()[0] - extra["mem"]
            if isinstance(out, TensorBase):  # (the usual result, without a call)
                g = out._grad_fn
                seq = g._seq if g is not None else -1
            else:
                seq = _seq_of(out)
            self.events.append((OP, name, start, end, tid, seq, extra or None))

    def _describe(self, name, args, kwargs):
        """What the options ask to record of an op's call, before it runs (``mem``: the
        traced memory then, the difference once it returned)."""
        extra = _inputs.describe(args, kwargs) if self.record_shapes else {}
        if self.with_flops:
            flops = _inputs.flops(name, args, kwargs)
            if flops:
                extra["flops"] = flops
        if self.profile_memory:
            extra["mem"] = _traced()[0]
        return extra

    def _mark_detailed(self):
        return now(), (_traced()[0] if self.profile_memory else 0)

    def shapes_of(self, grads):
        """Input shapes of a backward node given its gradients, when recording shapes."""
        return _inputs.grad_shapes(grads) if self.record_shapes else None

    def node_ran(self, name, seq, begin, ran=None, shapes=None):
        """A backward node's two events (PyTorch's): ``evaluate_function`` from mark
        ``begin`` to now (the node, its hooks and the routing of its outputs), the node
        until mark ``ran`` (None: now too). One raw event holds both (``PAIR``, unpacked
        by :meth:`finish`). Returns the mark of now, where a next node may begin."""
        end = self.mark()
        names = _NODE_NAMES.get(name)
        if names is None:
            pytorch = _CPP_NODES.get(name, name)
            names = _NODE_NAMES[name] = (pytorch, EVALUATE + pytorch)
        if seq >= NO_SEQ_FROM:
            seq = -1
        if not self.detailed:
            self.events.append((PAIR, names, begin, end, thread_id(), seq, ran))
            return end
        node_extra, eval_extra = {}, {}
        if shapes is not None:
            node_extra["shapes"] = shapes
        ran = end if ran is None else ran
        if self.profile_memory:
            node_extra["mem"] = ran[1] - begin[1]
            eval_extra["mem"] = end[1] - begin[1]
        self.events.append((PAIR, names, begin[0], end[0], thread_id(), seq,
                            (ran[0], node_extra or None, eval_extra or None)))
        return end

    def span(self, kind, name, begin, tid, seq=-1, extra=None):
        """An event from mark ``begin`` to now (``tid``: the thread it began on)."""
        end = now()
        start = begin
        if self.detailed:
            start = begin[0]
            if self.profile_memory:
                extra = dict(extra or (), mem=_traced()[0] - begin[1])
        if thread_id() != tid:  # ended on another thread: PyTorch calls that async
            extra = dict(extra or (), end_tid=thread_id())
        self.events.append((kind, name, start, end, tid, seq, extra))

    def add(self, kind, name, start, end, tid, seq=-1, extra=None):
        """An event timed elsewhere (an RPC's, from its send to its reply)."""
        if not self.closed:
            self.events.append((kind, name, start, end, tid, seq, extra))

    def flow(self, kind, flow_id, ts=None):
        """One end of an arrow between processes (``FLOW_OUT`` where a message leaves,
        ``FLOW_IN`` where it is served)."""
        t = now() if ts is None else ts
        self.events.append((kind, None, t, t, thread_id(), flow_id, None))

    # -- the end --
    def close(self):
        """Record no more (what profiling memory started is released); idempotent."""
        if not self.closed:
            self.closed = True
            self.enabled = False
            if self.profile_memory:
                _memory_out()

    def finish(self):
        """Close; the events as portable lists (epoch nanoseconds, names resolved, sequence
        numbers claimed), for results here or a reply to the profile's owner."""
        self.close()
        off = self.clock_offset
        native = {ident: n for ident, (n, _) in self.threads.items()}
        claimed = set()
        out = []
        # An op that recorded a node claims its sequence number; the innermost op ends
        # first, so enclosing ops (div -> mul) and ops returning an older tensor do not.
        events = sorted(self.events, key=lambda e: e[3])
        for kind, name, start, end, tid, seq, extra in events:
            tid = native.get(tid, tid)
            if kind == PAIR:
                ran, node_extra, eval_extra = extra if type(extra) is tuple else (extra, None,
                                                                                   None)
                out.append([EVAL, name[1], start + off, end + off, tid, seq, eval_extra])
                out.append([NODE, name[0], start + off, (end if ran is None else ran) + off,
                            tid, seq, node_extra])
                continue
            if kind == OP and seq >= 0:
                if seq < self.start_seq or seq in claimed:
                    seq = -1
                else:
                    claimed.add(seq)
            if kind == PY:  # (extra: the id of the enclosing Python call)
                name, extra = _python.event_name(name), {"parent": extra}
            out.append([kind, name, start + off, end + off, tid, seq, extra])
        return out


def _seq_of(out):
    """The sequence number of the node that recorded ``out`` (-1 when none)."""
    if not isinstance(out, TensorBase):
        if isinstance(out, tuple):
            out = out[0] if out and isinstance(out[0], TensorBase) else None
        else:
            return -1
        if out is None:
            return -1
    g = out._grad_fn
    return g._seq if g is not None else -1


def observed(name, fn):
    """``fn`` as the op ``name`` (PyTorch's, such as ``aten::mm``) for the profiler: a
    wrapper that costs one check of :data:`_active` when no thread records."""
    @functools.wraps(fn)
    def op(*args, **kwargs):
        if not _active:
            return fn(*args, **kwargs)
        tid = thread_id()
        rec = _recorders.get(tid)
        if rec is None or not rec.enabled or tid in rec.in_op:
            return fn(*args, **kwargs)
        return rec.call(name, fn, args, kwargs, tid)
    op.__profiler_name__ = name
    return op


# ---------------------------------------------------------------------- threads
def attach(rec):
    """Make this thread record into ``rec``; returns what :func:`detach` restores."""
    global _active
    tid = thread_id()
    if tid not in rec.threads:
        rec.threads[tid] = (threading.get_native_id(), threading.current_thread().name)
    tracer = _python.start(rec, tid, PY) if rec.with_stack else None
    with _lock:
        prev = _recorders.get(tid)
        _recorders[tid] = rec
        if prev is None:
            _active += 1
        rec.attached += 1
    return prev, tracer, rec


def detach(token):
    """Undo the :func:`attach` that returned ``token``."""
    global _active
    prev, tracer, rec = token
    if tracer is not None:
        _python.stop(tracer)
    tid = thread_id()
    with _lock:
        if prev is None:
            del _recorders[tid]
            _active -= 1
        else:
            _recorders[tid] = prev
        rec.attached -= 1
        if not rec.attached:
            _detached.notify_all()


#: How long a stopping profile waits for the requests of its session still being served
#: (a handler that sent its reply and is finishing): their last events belong to it.
SETTLE_TIMEOUT = 2.0


def settle(rec, timeout=SETTLE_TIMEOUT):
    """Wait (at most ``timeout`` s) until no thread records into ``rec`` (requests of its
    session still being served); the number of threads still at it."""
    with _lock:
        _detached.wait_for(lambda: not rec.attached, timeout)
        return rec.attached


# ---------------------------------------------------------------------- memory
def _memory_in():
    with _lock:
        _memory_users[0] += 1
        if _memory_users[0] == 1 and not tracemalloc.is_tracing():
            tracemalloc.start()
            _memory_users[1] = True


def _memory_out():
    with _lock:
        _memory_users[0] -= 1
        if _memory_users[0] == 0 and _memory_users[1]:
            tracemalloc.stop()
            _memory_users[1] = False


# ---------------------------------------------------------------------- sessions
# session id -> Recorder: this process's profiles, and the sessions it serves for peers.
_sessions = {}
_closed = {}  # peer sessions collected here: later requests of them are not recorded
MAX_PEER_SESSIONS = 64
_collectors = []


def register(rec):
    with _lock:
        _sessions[rec.session] = rec


def unregister(rec):
    with _lock:
        _sessions.pop(rec.session, None)


def session(sid):
    """The recorder of session ``sid`` on this process (None if none or closed)."""
    return _sessions.get(sid)


def open_session(sid, origin, options):
    """The recorder of a peer's session ``sid`` here, made on its first request (None once
    it was collected). At most :data:`MAX_PEER_SESSIONS` live: the oldest is dropped."""
    with _lock:
        rec = _sessions.get(sid)
        if rec is not None or sid in _closed:
            return rec
        peers = [s for s, r in _sessions.items() if r.origin is not None]
        if len(peers) >= MAX_PEER_SESSIONS:
            _sessions.pop(peers[0]).close()
        rec = _sessions[sid] = Recorder(session=sid, origin=origin, **options)
        return rec


def close_session(sid):
    """Remove a peer's session (collected); later requests of it are served unrecorded."""
    with _lock:
        rec = _sessions.pop(sid, None)
        _closed[sid] = True
        while len(_closed) > 4 * MAX_PEER_SESSIONS:
            del _closed[next(iter(_closed))]
    return rec


def peer_sessions():
    """Ids of the sessions this process records for peers' profiles (not collected yet)."""
    with _lock:
        return [sid for sid, rec in _sessions.items() if rec.origin is not None]


def add_collector(fn):
    """``fn(recorder)`` runs when a profile of this process stops: it adds what its peers
    recorded for the profile's session (``recorder.remote``). RPC installs one."""
    if fn not in _collectors:
        _collectors.append(fn)


def collect(rec):
    for fn in tuple(_collectors):
        fn(rec)

"""The communicator of a process-group world: messages, programs, failures, on one I/O thread.

One :class:`Communicator` per process and world (``init_process_group``); every
group of that world (``new_group``) shares it. It owns an RPC
:class:`~distgrad.rpc.transport.Transport` of its own (a bound ROUTER, a DEALER
per peer, ZMTP heartbeats and connection monitors for liveness) and is that
transport's handler object, so everything below runs on the transport's I/O
thread, which owns the sockets:

* a collective is a *program*: a generator (``algorithms.py``) that sends
  messages and ``yield``\\ s what it waits for, ``(peer, step)``. Programs
  submitted from any thread (``submit``) start on the I/O thread; a message
  that arrives resumes the program waiting for it, or waits in the stash until
  its program asks. So there is no thread hop per message, only one to start a
  collective and one to report its end (the caller waits on its :class:`Work`).
* a message of a collective carries ``[COLL, group, seq, step, fingerprint]``;
  ``seq`` numbers the collectives of a group, the fingerprint says what the
  sender called (op, shapes, dtypes, root, reduction). Each rank checks the
  fingerprint of every message of a collective it runs against its own; and
  every program hears from its left neighbour in the group before it ends (the
  algorithms' own messages, or an explicit one), so if ranks called different
  collectives, some rank sees it. That rank tells every member (MISMATCH, with
  what it called); each member answers with what it called, and every rank
  fails with the whole table. Nothing waits for a timeout.
* a peer that dies (the transport reports a killed process within ~0.2 s, a
  stopped one after the heartbeat timeout) or leaves fails every running
  collective of every group it belongs to, naming it; so does a program error,
  and a collective that outlives its group's timeout. Such a group is broken
  from then on: its members are told (ABORT) and later calls fail at once,
  since half-finished collectives leave ranks out of step.
* point-to-point messages (``send``/``recv``) carry ``[P2P, group, tag]`` and
  are matched in order per (source, tag), or from any source.
* large arrays to a peer on the same host go through shared memory
  (``rpc/shm.py``: warm segments, released when the receiver's last view of
  them is gone), after the probe that proves the peer can map them.
"""
import collections
import heapq
import itertools
import logging
import os
import shutil
import socket
import threading
import time

import numpy as np
import zmq

from distgrad.rpc import wire
from distgrad.rpc.options import RpcBackendOptions
from distgrad.rpc.pool import HandlerPool
from distgrad.rpc.shm import LendingContext, SameHost
from distgrad.rpc.transport import Transport
from distgrad.utils.tempdirs import owned_tempdir

from .errors import DistBackendError

__all__ = ["Communicator", "Program", "describe_fingerprint", "shm_handshake"]


#: Name prefix of the directory of a rank's ipc:// socket (with its pid after it).
IPC_DIR_PREFIX = "dg-pg-"

log = logging.getLogger("distgrad.distributed")
Kind = wire.Kind

COLL, P2P, MISMATCH, ABORT = 0, 1, 2, 3
_MAX_STASHED = 1 << 16     # messages one peer may have waiting for their program or recv
_SHM_THRESHOLD = 256 << 10  # arrays this large take shared memory to same-host peers
_MISMATCH_GRACE = 10.0      # how long to wait for every member's answer after a mismatch


def describe_fingerprint(fp):
    """``all_reduce(shape=[4], dtype=float32, op=SUM)`` for a fingerprint."""
    if fp is None:
        return "nothing"
    name, shapes, dtypes, params = fp
    parts = []
    if len(shapes) == 1:
        parts.append(f"shape={shapes[0]}")
    elif shapes:
        parts.append(f"shapes={shapes}")
    if dtypes:
        parts.append(f"dtype={dtypes[0]}" if len(set(dtypes)) == 1 else f"dtypes={dtypes}")
    parts += [f"{k}={v}" for k, v in params]
    return f"{name}({', '.join(parts)})"


class Group:
    """A group's state in the communicator (the Python-facing object is the ProcessGroup)."""

    __slots__ = ("gid", "ranks", "rank", "timeout", "name", "seq", "started", "broken",
                 "mismatch", "last_fp", "running", "gone")

    def __init__(self, gid, ranks, rank, timeout, name):
        self.gid, self.ranks, self.rank, self.timeout, self.name = gid, ranks, rank, timeout, name
        self.seq = 0          # last seq handed out (caller threads, under the comm lock)
        self.started = 0      # last seq started (I/O thread)
        self.broken = None    # the error every later call gets
        self.mismatch = None  # [seq, {rank: fingerprint}, deadline] while collecting answers
        self.last_fp = {}     # seq -> fingerprint of recent collectives (for reports)
        self.running = {}     # seq -> Program
        self.gone = {}        # rank -> error: members that left cleanly

    def describe(self):
        return f"group {self.name!r}" if self.name else "the default group"


class Program:
    """One collective on this rank: its generator and what it waits for.

    Algorithms see it as their context: ``rank``/``size`` in the group,
    ``send(peer, step, payload)``, and ``yield op.recv(peer, step)`` (peers are group
    ranks). ``heard`` holds the group ranks a message of this collective came from.
    """

    __slots__ = ("comm", "group", "seq", "fp", "body", "gen", "work", "deadline", "waiting",
                 "heard", "needs_left", "rank", "size", "on_done")

    def __init__(self, comm, group, fp, body, work, needs_left, on_done=None):
        self.comm, self.group, self.fp, self.body, self.work = comm, group, fp, body, work
        self.rank, self.size = group.rank, len(group.ranks)
        # the algorithm may end without a message from its left neighbour (or its first
        # message may not go to its right one): the communicator adds both (step -1)
        self.needs_left = needs_left
        self.on_done = on_done        # runs on success before the work completes (copy back)
        self.seq = self.gen = self.waiting = None
        self.deadline = float("inf")
        self.heard = set()

    def send(self, peer, step, payload):
        self.comm.send_coll(self, peer, step, payload)

    def recv(self, peer, step):
        return (peer, step)

    def describe(self):
        return f"{self.fp[0]} (collective #{self.seq} of {self.group.describe()})"

    def done(self):
        return self.gen is None and self.seq is not None

    def expire(self):
        self.comm._expire(self)


class _Shm(LendingContext):
    """Codec context of one data message: large arrays lent through shared memory."""

    __slots__ = ("comm", "peer", "segments", "mapped")

    def __init__(self, comm, peer, segments=()):
        self.comm, self.peer = comm, peer
        self.segments = list(segments)
        self.mapped = set()

    def _same_host(self):
        return self.comm.shm


class Communicator:
    """Sockets, liveness and collective programs of one process in a process-group world."""

    def __init__(self, rank, world_size, heartbeat_interval=0.5, heartbeat_timeout=3.0,
                 bind_addr="127.0.0.1"):
        self.rank, self.world_size = rank, world_size
        self.options = RpcBackendOptions(heartbeat_interval=heartbeat_interval,
                                         heartbeat_timeout=heartbeat_timeout, bind_addr=bind_addr,
                                         shm_threshold=_SHM_THRESHOLD)
        self.transport = Transport(f"pg-rank{rank}", rank, world_size, self.options, self)
        self.lock = threading.Lock()        # seq numbers and the submission queue
        self.groups = {}                    # gid -> Group
        self._submitted = collections.deque()
        self._waiting = {}                  # (gid, seq, step, src) -> Program
        self._stash = {}                    # (gid, seq, step, src) -> payload
        self._stashed = collections.Counter()  # src -> messages waiting in stash or p2p queues
        self._early = collections.defaultdict(list)  # gid -> messages of a group not made here yet
        self._p2p_msgs = collections.defaultdict(collections.deque)  # (gid, tag) -> (src, payload)
        self._p2p_recvs = collections.defaultdict(collections.deque)  # (gid, tag) -> recvs
        self._deadlines = []                # heap of (deadline, tiebreak, Program)
        self._tiebreak = itertools.count()
        self.shm = None  # the same-host path (made at connect)
        self._callbacks = None
        self._ipc_dir = None
        self.closed = False

    # ------------------------------------------------------------------ setup (caller thread)
    def bind(self):
        """Listen; return this rank's address for its peers: a TCP endpoint, and an ipc://
        one (lower latency) for peers on this host, with the host's boot id."""
        tcp = self.transport.bind(f"tcp://{self.options.bind_addr}:0")
        try:
            self._ipc_dir = owned_tempdir(IPC_DIR_PREFIX)
            ipc = f"ipc://{self._ipc_dir}/r{self.rank}.sock"
            self.transport.router.bind(ipc)
        except (OSError, zmq.ZMQError) as e:  # no unix sockets here: TCP only
            log.debug("process group: no ipc endpoint: %s", e)
            return tcp
        return f"{tcp} {ipc} {_boot_id()}"

    @staticmethod
    def _choose(address):
        """The endpoint to reach a peer at ``address`` (see :meth:`bind`): its ipc:// one
        when it runs on this host (same boot id, its socket file visible), else TCP."""
        parts = address.split()
        if len(parts) == 3 and parts[2] == _boot_id() and \
                os.path.exists(parts[1][len("ipc://"):]):
            return parts[1]
        return parts[0]

    def connect(self, addresses):
        self.shm = SameHost(_SHM_THRESHOLD, self.options.shm_pool_bytes, self.transport.wake,
                            enabled=self.world_size > 1)
        self._callbacks = HandlerPool(1, name=f"pg-callbacks-{self.rank}")
        self.transport.connect([self._choose(a) for a in addresses])

    def add_group(self, gid, ranks, timeout, name):
        """Register a group this process belongs to (members register the same ``gid``);
        collectives may be submitted at once (they start after it is registered)."""
        group = Group(gid, list(ranks), ranks.index(self.rank), timeout, name)
        with self.lock:
            self._submitted.append(("group", group))
        self.transport.wake()
        return group

    def remove_group(self, gid):
        with self.lock:
            self._submitted.append(("drop", gid))
        self.transport.wake()

    # ------------------------------------------------------------------ submitting (any thread)
    def submit(self, group, fp, body, work, needs_left=True, on_done=None):
        """Start collective ``fp`` whose algorithm is ``body(program)`` (a generator
        function); ``work`` completes when it ends. Fails at once in a broken group."""
        prog = Program(self, group, fp, body, work, needs_left, on_done)
        with self.lock:
            self._check_usable(group)
            group.seq += 1
            prog.seq = group.seq
            prog.deadline = time.monotonic() + group.timeout
            self._submitted.append(("run", prog))
        self.transport.wake()
        return work

    def submit_p2p(self, group, kind, peer, tag, array, work, on_done=None):
        """``kind`` "send": ``array`` (any codec value) to global rank ``peer``; "recv": into
        the flat ``array`` from ``peer`` (None: any member; ``array`` None: take whatever
        value comes, as the work's result), then ``on_done()``. Point-to-point messages are
        outside the order of collectives."""
        with self.lock:
            self._check_usable(group, kind)
            self._submitted.append((kind, (group, peer, tag, array, work, on_done,
                                           time.monotonic() + group.timeout)))
        self.transport.wake()
        return work

    def _check_usable(self, group, kind="run"):
        if group.broken is not None and kind != "recv":  # a recv may find a message kept
            raise DistBackendError(str(group.broken)) from group.broken
        if self.closed:
            raise DistBackendError("the process group was destroyed")

    # ------------------------------------------------------------------ transport handlers
    # (the I/O thread; none blocks)
    def on_request(self, ident, mid, src, extra, segments, frames):
        ctx = _Shm(self, src, segments)
        try:
            if type(extra) is not list or len(extra) != 5 or type(extra[0]) is not int \
                    or type(extra[1]) is not int or type(extra[2]) is not int \
                    or type(extra[3]) is not int:
                raise ValueError("malformed process-group header")
            kind, gid, a, b, meta = extra
            payload = wire.decode(frames[0].buffer, frames[1:], ctx) if kind in (COLL, P2P) \
                else None
        except Exception as e:  # noqa: BLE001 - a malformed message is dropped and logged
            self.transport.drop(f"process-group message from rank {src}: {e}")
            return
        finally:
            self.shm.settle(src, segments, ctx.mapped)
        self._deliver(src, kind, gid, a, b, meta, payload)

    def _deliver(self, src, kind, gid, a, b, meta, payload):
        group = self.groups.get(gid)
        if group is None:
            # a group the peer made before this process did: keep until it is made here
            if self._stashed[src] < _MAX_STASHED:
                self._stashed[src] += 1
                self._early[gid].append((src, kind, gid, a, b, meta, payload))
            else:
                self.transport.drop(f"rank {src} sent more than {_MAX_STASHED} messages for "
                                    "groups not made here")
            return
        if src not in group.ranks:
            self.transport.drop(f"rank {src} sent a message for {group.describe()}, which it "
                                "is not a member of")
            return
        if kind == COLL:
            self._on_coll(group, src, a, b, meta, payload)
        elif kind == P2P:
            self._on_p2p(group, src, a, payload)
        elif kind == MISMATCH:
            self._on_mismatch(group, a, {src: meta})
        elif kind == ABORT:
            why = meta if isinstance(meta, str) else "no reason given"
            self._break(group, DistBackendError(f"rank {src} aborted collective #{a} of "
                                                f"{group.describe()}: {why[:2000]}"), tell=False)

    def on_reply(self, rank, kind, mid, extra, segments, frames):
        self.on_late(rank, segments)  # nothing here makes calls

    def on_late(self, src, segments):
        self.shm.settle(src, segments)

    def on_release(self, src, names):
        self.shm.released(src, names)

    def on_peer_down(self, rank, why, left):
        self.shm.peer_gone(rank)
        what = "left the process group" if left else "is unreachable"
        for group in list(self.groups.values()):
            if rank not in group.ranks:
                continue
            err = DistBackendError(f"rank {rank} {what} ({why}); {group.describe()} cannot "
                                   "run collectives that need it")
            if not left:
                self._break(group, err, tell=False)
                continue
            # a clean departure: what it sent before leaving is here and may still be
            # used (a peer that finished a collective leaves while this rank finishes it);
            # whatever waits for more from it fails
            group.gone[rank] = err
            if any(prog.waiting is not None and prog.waiting[3] == rank
                   for prog in group.running.values()):
                self._break(group, err, tell=False, keep_received=True)
            self._fail_recvs_from(group, rank, err)

    def on_peer_up(self, rank):
        log.warning("process group: rank %d answers again, but its groups stay broken", rank)

    def on_fatal(self, exc):
        err = DistBackendError(f"the process group's I/O thread failed: {type(exc).__name__}: "
                               f"{exc}")
        for group in list(self.groups.values()):
            self._break(group, err, tell=False)
        self._fail_submitted(err)

    def next_deadline(self):
        d = self._deadlines
        while d and d[0][2].done():  # finished work leaves its entry behind
            heapq.heappop(d)
        soonest = d[0][0] if d else float("inf")
        for group in self.groups.values():
            if group.mismatch is not None:
                soonest = min(soonest, group.mismatch[2])
        return soonest

    def on_tick(self, now):
        self._start_submitted()
        d = self._deadlines
        while d and (d[0][2].done() or d[0][0] <= now):
            _, _, item = heapq.heappop(d)
            if not item.done():
                item.expire()
        for group in list(self.groups.values()):
            if group.mismatch is not None and now >= group.mismatch[2]:
                if self.rank not in group.mismatch[1]:
                    self._answer_mismatch(group, None)
                self._conclude_mismatch(group)
        self.shm.send_releases(self.transport, self.rank)

    # ------------------------------------------------------------------ starting work
    def _start_submitted(self):
        while True:
            with self.lock:
                if not self._submitted:
                    return
                what, item = self._submitted.popleft()
            if what == "run":
                self._start(item)
            elif what == "group":
                self.groups[item.gid] = item
                for msg in self._early.pop(item.gid, ()):
                    self._stashed[msg[0]] -= 1
                    self._deliver(*msg)
            elif what == "drop":
                self._drop_group(item)
            else:
                self._start_p2p(what, *item)

    def _start(self, prog):
        group = prog.group
        if group.broken is not None:
            prog.work._finish(group.broken, self._callbacks)
            return
        group.started = max(group.started, prog.seq)
        group.running[prog.seq] = prog
        group.last_fp[prog.seq] = prog.fp
        if len(group.last_fp) > 8:
            del group.last_fp[min(group.last_fp)]
        prog.gen = prog.body(prog)
        heapq.heappush(self._deadlines, (prog.deadline, next(self._tiebreak), prog))
        if prog.needs_left and prog.size > 1:
            # tell the right neighbour what this rank runs (the algorithm may not)
            self._send(group.ranks[(prog.rank + 1) % prog.size],
                       [COLL, group.gid, prog.seq, -1, prog.fp], None)
        if group.mismatch is not None and prog.seq >= group.mismatch[0]:
            # ranks disagree: this collective waits for the verdict instead of running
            if prog.seq == group.mismatch[0] and self.rank not in group.mismatch[1]:
                self._answer_mismatch(group, prog.fp)
                self._on_mismatch(group, prog.seq, {})
            return
        # messages that came before this collective started: check what their senders called
        for key in [k for k in self._stash if k[0] == group.gid and k[1] == prog.seq]:
            if not self._check_fp(prog, key[3], self._stash[key][0]):
                return
        self._advance(prog, None)

    def _advance(self, prog, value):
        """Run ``prog`` until it waits for a message that is not here yet, or ends."""
        with np.errstate(all="ignore"):  # reductions overflow as PyTorch's do: silently
            self._step(prog, value)

    def _step(self, prog, value):
        group = prog.group
        try:
            while True:
                peer, step = prog.gen.send(value)
                src = group.ranks[peer]
                key = (group.gid, prog.seq, step, src)
                got = self._stash.pop(key, None)
                if got is None:
                    if src in group.gone:  # it left without sending this
                        self._break(group, group.gone[src], tell=False, keep_received=True)
                        return
                    self._waiting[key] = prog
                    prog.waiting = key
                    return
                self._stashed[src] -= 1
                value = got[1]
        except StopIteration:
            pass
        except Exception as e:  # noqa: BLE001 - the collective fails, and with it the group
            log.debug("collective %s failed", prog.describe(), exc_info=True)
            err = e if isinstance(e, DistBackendError) else DistBackendError(
                f"{prog.describe()} failed on rank {self.rank}: {type(e).__name__}: {e}")
            err.__cause__ = e
            self._break(group, err, tell=True, seq=prog.seq)
            return
        if prog.needs_left and prog.size > 1 and group.ranks[(prog.rank - 1) % prog.size] \
                not in prog.heard:
            # hear from the left neighbour before ending (see the module doc): wait for the
            # fingerprint it sent when it started
            prog.gen = _wait_for_left(prog)
            self._step(prog, None)
            return
        self._finish(prog)

    def _finish(self, prog, exc=None):
        group = prog.group
        prog.gen = None
        if prog.waiting is not None:
            self._waiting.pop(prog.waiting, None)
            prog.waiting = None
        group.running.pop(prog.seq, None)
        for key in [k for k in self._stash if k[0] == group.gid and k[1] == prog.seq]:
            self._stashed[key[3]] -= 1  # fingerprint messages nobody waited for
            del self._stash[key]
        if exc is None and prog.on_done is not None:
            try:
                prog.on_done()
            except Exception as e:  # noqa: BLE001 - reported to the caller
                exc = e
        prog.work._finish(exc, self._callbacks)

    # ------------------------------------------------------------------ collective messages
    def send_coll(self, prog, peer, step, payload):
        dst = prog.group.ranks[peer]
        if dst == self.rank:
            raise RuntimeError("a collective program sent a message to its own rank")
        self._send(dst, [COLL, prog.group.gid, prog.seq, step, prog.fp], payload)

    def _on_coll(self, group, src, seq, step, fp, payload):
        key = (group.gid, seq, step, src)
        prog = group.running.get(seq)
        if prog is None and seq <= group.started:
            return  # the collective ended (or failed) here: a late message
        if prog is not None and not self._check_fp(prog, src, fp):
            return
        waiter = self._waiting.pop(key, None)
        if waiter is not None:
            waiter.waiting = None
            self._advance(waiter, payload)
            return
        if self._stashed[src] >= _MAX_STASHED:
            self._break(group, DistBackendError(
                f"rank {src} sent more than {_MAX_STASHED} messages that no collective here "
                "asked for"), tell=True)
            return
        self._stash[key] = (fp, payload)
        self._stashed[src] += 1

    def _check_fp(self, prog, src, fp):
        prog.heard.add(src)
        if fp == prog.fp:
            return True
        self._on_mismatch(prog.group, prog.seq, {src: fp})
        return False

    # ------------------------------------------------------------------ mismatches
    def _on_mismatch(self, group, seq, reports):
        """Ranks called different collectives at ``seq``: collect what every member called,
        then fail every rank's collective with the whole table. A rank that has not
        reached ``seq`` yet answers when it does (or, after the grace period, that it
        has not called it)."""
        if group.mismatch is None:
            if group.broken is not None:
                return
            group.mismatch = [seq, {}, time.monotonic() + min(group.timeout, _MISMATCH_GRACE)]
            if seq <= group.started:
                self._answer_mismatch(group, group.last_fp.get(seq))
        elif seq != group.mismatch[0]:
            return
        for r, fp in reports.items():
            if fp is None or _valid_fp(fp):
                group.mismatch[1][r] = fp
        if len(group.mismatch[1]) == len(group.ranks):
            self._conclude_mismatch(group)

    def _answer_mismatch(self, group, mine):
        """Tell every member what this rank called at the mismatched collective."""
        seq, called, _ = group.mismatch
        called[self.rank] = mine
        for r in group.ranks:
            if r != self.rank and self.transport.down(r) is None:
                self._send(r, [MISMATCH, group.gid, seq, 0, mine], None)

    def _conclude_mismatch(self, group):
        seq, called, _ = group.mismatch
        group.mismatch = None
        lines = []
        for r in group.ranks:
            if r not in called:
                lines.append(f"rank {r} did not answer")
            elif called[r] is None:
                lines.append(f"rank {r} did not call collective #{seq} within "
                             f"{min(group.timeout, _MISMATCH_GRACE):g} s")
            else:
                lines.append(f"rank {r} called {describe_fingerprint(called[r])}")
        err = DistBackendError(f"Detected mismatch between collectives on ranks of "
                               f"{group.describe()} at collective #{seq}: " + "; ".join(lines))
        self._break(group, err, tell=False)

    # ------------------------------------------------------------------ failures
    def _expire(self, prog):
        group = prog.group
        waiting = ""
        if prog.waiting is not None:
            waiting = f" waiting for rank {prog.waiting[3]}"
        self._break(group, DistBackendError(
            f"{prog.describe()} timed out after {group.timeout:g} s{waiting} on rank "
            f"{self.rank}"), tell=True, seq=prog.seq)

    def _break(self, group, err, tell, seq=0, keep_received=False):
        """Fail every collective of ``group`` with ``err``; later calls fail at once too.
        With ``keep_received`` (a member left cleanly), messages it sent before leaving
        can still be received."""
        if group.broken is not None:
            return
        group.broken = err
        group.mismatch = None
        if tell:
            for r in group.ranks:
                if r != self.rank and self.transport.down(r) is None:
                    self._send(r, [ABORT, group.gid, seq, 0, str(err)[:4000]], None)
        for prog in list(group.running.values()):
            self._finish(prog, err)
        for key in [k for k in self._stash if k[0] == group.gid]:
            self._stashed[key[3]] -= 1
            del self._stash[key]
        for key in [k for k in self._p2p_recvs if k[0] == group.gid]:
            for entry in self._p2p_recvs.pop(key):
                work, entry[3] = entry[3], None
                work._finish(err, self._callbacks)
        if keep_received:
            return
        for key in [k for k in self._p2p_msgs if k[0] == group.gid]:
            for src, _ in self._p2p_msgs.pop(key):
                self._stashed[src] -= 1

    def _fail_submitted(self, err):
        with self.lock:
            items, self._submitted = list(self._submitted), collections.deque()
        for what, item in items:
            if what == "run":
                item.work._finish(err, self._callbacks)
            elif what in ("send", "recv"):
                item[4]._finish(err, self._callbacks)

    def _drop_group(self, gid):
        group = self.groups.pop(gid, None)
        if group is not None:
            self._break(group, DistBackendError(f"{group.describe()} was destroyed"), tell=False)

    # ------------------------------------------------------------------ point to point
    def _start_p2p(self, kind, group, peer, tag, array, work, on_done, deadline):
        if kind == "send":
            if group.broken is not None or peer in group.gone:
                work._finish(group.broken or group.gone[peer], self._callbacks)
                return
            self._send(peer, [P2P, group.gid, tag, 0, None], array)
            work._finish(None, self._callbacks)
            return
        entry = [peer, array, on_done, work]
        msgs = self._p2p_msgs.get((group.gid, tag))
        if msgs:  # received before (also from a peer that has left since)
            for i, (src, payload) in enumerate(msgs):
                if peer is None or src == peer:
                    del msgs[i]
                    self._stashed[src] -= 1
                    self._complete_recv(entry, src, payload)
                    return
        if group.broken is not None or self._unreachable(group, peer) is not None:
            work._finish(group.broken or self._unreachable(group, peer), self._callbacks)
            return
        self._p2p_recvs[(group.gid, tag)].append(entry)
        heapq.heappush(self._deadlines, (deadline, next(self._tiebreak), _PostedRecv(
            self, group, entry)))

    @staticmethod
    def _unreachable(group, peer):
        """Why a recv from ``peer`` (None: any member) can get nothing more, or None."""
        if peer is not None:
            return group.gone.get(peer)
        others = [r for r in group.ranks if r != group.ranks[group.rank]]
        if others and all(r in group.gone for r in others):
            return group.gone[others[0]]
        return None

    def _fail_recvs_from(self, group, rank, err):
        """Posted recvs that only ``rank`` (gone) could have satisfied fail."""
        for key in [k for k in self._p2p_recvs if k[0] == group.gid]:
            queue = self._p2p_recvs[key]
            for entry in list(queue):
                if self._unreachable(group, entry[0]) is not None:
                    queue.remove(entry)
                    work, entry[3] = entry[3], None
                    work._finish(err, self._callbacks)

    def _on_p2p(self, group, src, tag, payload):
        recvs = self._p2p_recvs.get((group.gid, tag))
        if recvs:
            for i, entry in enumerate(recvs):
                if entry[0] is None or entry[0] == src:
                    del recvs[i]
                    self._complete_recv(entry, src, payload)
                    return
        if self._stashed[src] >= _MAX_STASHED:
            self._break(group, DistBackendError(f"rank {src} sent more than {_MAX_STASHED} "
                                                "messages nobody received"), tell=True)
            return
        self._p2p_msgs[(group.gid, tag)].append((src, payload))
        self._stashed[src] += 1

    def _complete_recv(self, entry, src, payload):
        _, out, on_done, work = entry
        entry[3] = None  # done: its deadline entry is stale now
        exc = None
        work._source = src
        if out is None:
            work._result = [payload]
        elif type(payload) is not np.ndarray or payload.size != out.size \
                or payload.dtype != out.dtype:
            got = (f"{payload.size} elements of {payload.dtype}" if type(payload) is np.ndarray
                   else f"a {type(payload).__name__}")
            exc = DistBackendError(f"recv: rank {src} sent {got}, but the tensor passed to "
                                   f"recv here holds {out.size} elements of {out.dtype}")
        else:
            out[...] = payload.reshape(-1)
            if on_done is not None:
                on_done()
        work._finish(exc, self._callbacks)

    # ------------------------------------------------------------------ sending (I/O thread)
    def _send(self, dst, extra, payload):
        ctx = _Shm(self, dst)
        body, bufs = wire.encode(payload, ctx)
        frames = [wire.pack_header(Kind.CALL, 0, self.rank, extra, ctx.segments or None), body,
                  *bufs]
        sock = self.transport.dealers[dst]
        try:
            last = len(frames) - 1
            for i, f in enumerate(frames):
                # a copy: the caller may write into its tensor as soon as the collective ends
                sock.send(f, zmq.SNDMORE if i < last else 0, copy=True)
        except zmq.ZMQError as e:  # the socket is closing: the peer hears LEAVE anyway
            self.shm.give_back(dst, ctx.segments)
            log.debug("process group: sending to rank %d failed: %s", dst, e)

    # ------------------------------------------------------------------ shutdown
    def lent(self):
        return self.shm.lent() if self.shm is not None else 0

    def close(self, timeout=5.0):
        """Leave: let peers finish reading what this process lent them (bounded), then
        stop the I/O thread (peers are told: LEAVE) and free the sockets and segments."""
        with self.lock:
            if self.closed:
                return
            self.closed = True
        deadline = time.monotonic() + timeout
        while self.lent() and time.monotonic() < deadline and self.transport.running():
            time.sleep(0.005)
        self.transport.close(announce="destroy_process_group() was called")
        err = DistBackendError("the process group was destroyed")
        self._fail_submitted(err)
        for group in list(self.groups.values()):
            if group.broken is None:
                group.broken = err
            for prog in list(group.running.values()):
                prog.work._finish(err, None)
        if self._callbacks is not None:
            self._callbacks.shutdown()
        if self.shm is not None:
            self.shm.close()
        if self._ipc_dir is not None:
            shutil.rmtree(self._ipc_dir, ignore_errors=True)


def _boot_id():
    """This boot of this host (processes that share it share the kernel: ipc:// works)."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as fh:
            return fh.read().strip() or "unknown"
    except OSError:
        return f"host-{socket.gethostname()}"


class _PostedRecv:
    """A posted recv in the deadline heap (beside the programs)."""

    __slots__ = ("comm", "group", "entry")

    def __init__(self, comm, group, entry):
        self.comm, self.group, self.entry = comm, group, entry

    def done(self):
        return self.entry[3] is None

    def expire(self):
        self.comm._break(self.group, DistBackendError(
            f"recv from {'any rank' if self.entry[0] is None else f'rank {self.entry[0]}'} "
            f"timed out after {self.group.timeout:g} s in {self.group.describe()}"), tell=True)


def _wait_for_left(prog):
    """The tail of a program that has not heard from its left neighbour yet: wait for the
    fingerprint message it sent when it started (step -1)."""
    yield prog.recv((prog.rank - 1) % prog.size, -1)


def _valid_fp(fp):
    return (type(fp) is list and len(fp) == 4 and type(fp[0]) is str
            and type(fp[1]) is list and type(fp[2]) is list and type(fp[3]) is list)


def shm_handshake(comm):
    """A program for the world group at start: each rank proves to each peer that the peer
    can map a segment it made (``SegmentPool.probe``); only then do large arrays to that
    peer take shared memory. It also serves as the start barrier."""
    def program(prog):
        r, n = prog.rank, prog.size
        ranks = prog.group.ranks
        probe = comm.shm.probe()
        record = list(probe) if probe is not None else None
        answers = {}
        try:
            for p in range(n):
                if p != r:
                    prog.send(p, 0, record)
            for p in range(n):
                if p != r:
                    x = yield prog.recv(p, 0)
                    ok = type(x) is list and len(x) == 3 and comm.shm.check_probe(ranks[p], *x)
                    prog.send(p, 1, bool(ok))
            for p in range(n):
                if p != r:
                    answers[ranks[p]] = (yield prog.recv(p, 1)) is True
        finally:
            if probe is not None:
                for rank, ok in answers.items():
                    comm.shm.probed(rank, probe, ok)
                comm.shm.pool.end_probe(probe[1])  # also when a peer never answered
    return program

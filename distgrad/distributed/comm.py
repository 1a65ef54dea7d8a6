"""The communicator of a process-group world: sockets, liveness and groups, on one I/O thread.

One :class:`Communicator` per process and world (``init_process_group``); every
group of that world (``new_group``) shares it. It owns an RPC
:class:`~distgrad.rpc.transport.Transport` of its own (a bound ROUTER, a DEALER
per peer, ZMTP heartbeats and connection monitors for liveness) and is that
transport's handler object, so all it does runs on the transport's I/O thread,
which owns the sockets. Other threads only hand it work (``submit``,
``submit_p2p``, ``add_group``, ``remove_group``) through one queue, so work starts
in the order it was handed over, and the parts it is made of, which run on the I/O
thread alone, need no locks:

* collectives run as programs (``programs.py``: :class:`ProgramRunner`, with the
  fingerprint checks and the MISMATCH protocol that catch ranks calling different
  collectives);
* point-to-point messages (``send``/``recv``) are matched in ``p2p.py``
  (:class:`PointToPoint`);
* what the ranks send each other, and how much of it may wait, is in ``messages.py``.

The communicator routes each message to its part, and breaks groups:

* a peer that dies (the transport reports a killed process within ~0.2 s, a
  stopped one after the heartbeat timeout) or leaves fails every running
  collective of every group it belongs to, naming it; so does a program error,
  and a collective that outlives its group's timeout. Such a group is broken
  from then on (:meth:`Communicator.break_group`): its members are told (ABORT)
  and later calls fail at once, since half-finished collectives leave ranks out
  of step.
* large arrays to a peer on the same host go through shared memory
  (``rpc/shm.py``: warm segments, released when the receiver's last view of
  them is gone), after the probe that proves the peer can map them
  (``programs.shm_handshake``).
"""
import collections
import heapq
import itertools
import logging
import os
import shutil
import threading
import time

import zmq

from distgrad.rpc import wire
from distgrad.rpc.credentials import Credential
from distgrad.rpc.options import RpcBackendOptions
from distgrad.rpc.pool import HandlerPool
from distgrad.rpc.shm import LendingContext, SameHost
from distgrad.rpc.transport import Transport
from distgrad.utils import addresses
from distgrad.utils.host import network_id
from distgrad.utils.tempdirs import owned_tempdir

from .errors import DistBackendError
from .messages import ABORT, COLL, MISMATCH, P2P, Backlog
from .p2p import P2PRequest, PointToPoint
from .programs import Program, ProgramRunner

__all__ = ["Communicator"]


#: Name prefix of the directory of a rank's ipc:// socket (with its pid after it).
IPC_DIR_PREFIX = "dg-pg-"

log = logging.getLogger("distgrad.distributed")
Kind = wire.Kind

_SHM_THRESHOLD = 256 << 10  # arrays this large take shared memory to same-host peers


class Group:
    """A group's state in the communicator (the Python-facing object is the ProcessGroup).

    Its collectives' fields (``seq``, ``started``, ``mismatch``, ``last_fp``,
    ``running``) are the program runner's (``programs.py``); ``broken`` and ``gone``
    are everyone's.
    """

    __slots__ = ("gid", "ranks", "rank", "timeout", "name", "seq", "started", "broken",
                 "mismatch", "last_fp", "running", "gone")

    def __init__(self, gid, ranks, rank, timeout, name):
        self.gid, self.ranks, self.rank, self.timeout, self.name = gid, ranks, rank, timeout, name
        self.seq = 0          # last seq handed out (caller threads, under the comm lock)
        self.started = 0      # last seq started (I/O thread)
        self.broken = None    # the error every later call gets
        self.mismatch = None  # answers collected after a mismatch (see programs.py)
        self.last_fp = {}     # seq -> fingerprint of recent collectives (for reports)
        self.running = {}     # seq -> Program
        self.gone = {}        # rank -> error: members that left cleanly

    def describe(self):
        return f"group {self.name!r}" if self.name else "the default group"


class _Shm(LendingContext):
    """Codec context of one data message: large arrays lent through shared memory."""

    __slots__ = ("comm", "peer", "segments", "mapped")

    def __init__(self, comm, peer, segments=()):
        self.comm, self.peer = comm, peer
        self.segments = list(segments)
        self.mapped = set()

    def _same_host(self):
        return self.comm.shm


class Deadlines:
    """What must end by a deadline (collectives, posted recvs), soonest first.

    Entries say whether they are ``done()`` and how to ``expire()``; finished ones
    are not taken out when they finish but when they reach the top (a heap cannot
    remove from its middle cheaply, and most work finishes long before its deadline).
    """

    def __init__(self):
        self._heap = []                     # (deadline, tiebreak, entry)
        self._tiebreak = itertools.count()  # entries themselves do not compare

    def add(self, deadline, entry):
        heapq.heappush(self._heap, (deadline, next(self._tiebreak), entry))

    def soonest(self):
        heap = self._heap
        while heap and heap[0][2].done():
            heapq.heappop(heap)
        return heap[0][0] if heap else float("inf")

    def expire(self, now):
        """Expire every entry whose deadline is ``now`` or earlier and is not done."""
        heap = self._heap
        while heap and (heap[0][2].done() or heap[0][0] <= now):
            _, _, entry = heapq.heappop(heap)
            if not entry.done():
                entry.expire()


class Communicator:
    """Sockets, liveness and groups of one process in a process-group world; it hands
    collectives to its :class:`ProgramRunner` (``programs``) and sends and recvs to its
    :class:`PointToPoint` (``p2p``), and routes their messages to them."""

    def __init__(self, rank, world_size, heartbeat_interval=0.5, heartbeat_timeout=3.0,
                 address=None, simulated_link=None):
        self.rank, self.world_size = rank, world_size
        # where to bind and what to advertise (utils/addresses.py; None: loopback)
        self.address = address or addresses.choose(None, "pg", env={})
        self.options = RpcBackendOptions(heartbeat_interval=heartbeat_interval,
                                         heartbeat_timeout=heartbeat_timeout,
                                         bind_addr=self.address.bind,
                                         shm_threshold=_SHM_THRESHOLD,
                                         # the transport holds peers' messages as a link
                                         # between hosts would (rpc/link.py)
                                         simulated_link=simulated_link)
        # authenticated as an RPC world: members only, each as its own rank (members.py)
        self.transport = Transport(f"pg-rank{rank}", rank, world_size, self.options, self,
                                   Credential(self.options.mechanism))
        self.lock = threading.Lock()        # seq numbers and the submission queue
        self.groups = {}                    # gid -> Group
        # what other threads hand the I/O thread, started in this order: ("run", Program),
        # ("p2p", P2PRequest), ("group", Group), ("drop", gid). One queue for all, so that a
        # group is made before its first collective, and work starts in the caller's order
        self._submitted = collections.deque()
        self._early = collections.defaultdict(list)  # gid -> messages of a group not made here yet
        self.backlog = Backlog()            # messages from each peer that wait for a taker
        self.deadlines = Deadlines()
        self.programs = ProgramRunner(self)
        self.p2p = PointToPoint(self)
        self.shm = None  # the same-host path (made at connect)
        self.callbacks = None  # runs the user's callbacks of finished work (made at connect)
        self._ipc_dir = None
        self.closed = False

    # ------------------------------------------------------------------ setup (caller thread)
    def bind(self):
        """Listen; return this rank's address for its peers: a TCP endpoint, and an ipc://
        one (lower latency) for peers on this host, with the host's :func:`network_id`."""
        here = self.address
        tcp = self.transport.bind(addresses.endpoint(here.bind, 0))
        host, port = addresses.host_port(tcp)
        if addresses.is_wildcard(host):
            tcp = addresses.endpoint(here.advertise, port)
        try:
            self._ipc_dir = owned_tempdir(IPC_DIR_PREFIX)
            ipc = f"ipc://{self._ipc_dir}/r{self.rank}.sock"
            self.transport.router.bind(ipc)
        except (OSError, zmq.ZMQError) as e:  # no unix sockets here: TCP only
            log.debug("process group: no ipc endpoint: %s", e)
            return tcp
        return f"{tcp} {ipc} {network_id()}"

    @staticmethod
    def _choose(address):
        """The endpoint to reach a peer at ``address`` (see :meth:`bind`): its ipc:// one
        when it runs on this host (same network id, its socket file visible), else TCP."""
        parts = address.split()
        if len(parts) == 3 and parts[2] == network_id() and \
                os.path.exists(parts[1][len("ipc://"):]):
            return parts[1]
        return parts[0]

    @property
    def verifier(self):
        """What checks this rank's credential, for its entry in the store (members.py)."""
        return self.transport.credential.verifier

    def connect(self, addresses, verifiers):
        """Connect to every rank at ``addresses``, admitting only connections that present
        the credential ``verifiers`` check, each as its rank."""
        self.shm = SameHost(_SHM_THRESHOLD, self.options.shm_pool_bytes, self.transport.wake,
                            enabled=self.world_size > 1 and not self.options.simulated_link)
        self.callbacks = HandlerPool(1, name=f"pg-callbacks-{self.rank}")
        self.transport.connect([self._choose(a) for a in addresses], verifiers)

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
        prog = Program(self.programs, group, fp, body, work, needs_left, on_done)
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
            self._submitted.append(("p2p", P2PRequest(kind, group, peer, tag, array, work,
                                                      on_done, time.monotonic() + group.timeout)))
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
            if self.backlog.keep(src):
                self._early[gid].append((src, kind, gid, a, b, meta, payload))
            else:
                self.transport.drop(f"rank {src} sent more than {self.backlog.limit} messages "
                                    "for groups not made here")
            return
        if src not in group.ranks:
            self.transport.drop(f"rank {src} sent a message for {group.describe()}, which it "
                                "is not a member of")
            return
        if kind == COLL:
            self.programs.on_message(group, src, a, b, meta, payload)
        elif kind == P2P:
            self.p2p.on_message(group, src, a, payload)
        elif kind == MISMATCH:
            self.programs.on_mismatch(group, a, {src: meta})
        elif kind == ABORT:
            why = meta if isinstance(meta, str) else "no reason given"
            self.break_group(group, DistBackendError(f"rank {src} aborted collective #{a} of "
                                                     f"{group.describe()}: {why[:2000]}"),
                             tell=False)

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
                self.break_group(group, err, tell=False)
                continue
            # a clean departure: what it sent before leaving is here and may still be
            # used (a peer that finished a collective leaves while this rank finishes it);
            # whatever waits for more from it fails
            group.gone[rank] = err
            if self.programs.waits_for(group, rank):
                self.break_group(group, err, tell=False, keep_received=True)
            self.p2p.fail_recvs_from(group, rank, err)

    def on_peer_up(self, rank):
        log.warning("process group: rank %d answers again, but its groups stay broken", rank)

    def on_fatal(self, exc):
        err = DistBackendError(f"the process group's I/O thread failed: {type(exc).__name__}: "
                               f"{exc}")
        for group in list(self.groups.values()):
            self.break_group(group, err, tell=False)
        self._fail_submitted(err)

    def next_deadline(self):
        return min(self.deadlines.soonest(), self.programs.next_deadline())

    def on_tick(self, now):
        self._start_submitted()
        self.deadlines.expire(now)
        self.programs.on_tick(now)
        self.shm.send_releases(self.transport, self.rank)

    # ------------------------------------------------------------------ starting work
    def _start_submitted(self):
        while True:
            with self.lock:
                if not self._submitted:
                    return
                what, item = self._submitted.popleft()
            if what == "run":
                self.programs.start(item)
            elif what == "p2p":
                self.p2p.start(item)
            elif what == "group":
                self.groups[item.gid] = item
                for msg in self._early.pop(item.gid, ()):
                    self.backlog.taken(msg[0])
                    self._deliver(*msg)
            elif what == "drop":
                self._drop_group(item)

    # ------------------------------------------------------------------ failures
    def break_group(self, group, err, tell, seq=0, keep_received=False):
        """Fail every collective of ``group`` with ``err``; later calls fail at once too.
        With ``tell``, its members hear of it (ABORT: they break it as well, instead of
        waiting for messages that will not come). With ``keep_received`` (a member left
        cleanly), messages it sent before leaving can still be received."""
        if group.broken is not None:
            return
        group.broken = err
        if tell:
            self.tell_members(group, [ABORT, group.gid, seq, 0, str(err)[:4000]])
        self.programs.fail_group(group, err)
        self.p2p.fail_group(group, err, keep_received)

    def _fail_submitted(self, err):
        with self.lock:
            items, self._submitted = list(self._submitted), collections.deque()
        for what, item in items:
            if what in ("run", "p2p"):  # a Program or a P2PRequest
                item.work._finish(err, self.callbacks)

    def _drop_group(self, gid):
        group = self.groups.pop(gid, None)
        if group is not None:
            self.break_group(group, DistBackendError(f"{group.describe()} was destroyed"),
                             tell=False)

    # ------------------------------------------------------------------ sending (I/O thread)
    def send_message(self, dst, extra, payload):
        """Send ``payload`` with header ``extra`` (see ``messages.py``) to global rank ``dst``."""
        ctx = _Shm(self, dst)
        body, bufs = wire.encode(payload, ctx)
        frames = [wire.pack_header(Kind.CALL, 0, self.rank, extra, ctx.segments or None), body,
                  *bufs]
        sock = self.transport.io_socket(dst)
        try:
            last = len(frames) - 1
            for i, f in enumerate(frames):
                # a copy: the caller may write into its tensor as soon as the collective ends
                sock.send(f, zmq.SNDMORE if i < last else 0, copy=True)
        except zmq.ZMQError as e:  # the socket is closing: the peer hears LEAVE anyway
            self.shm.give_back(dst, ctx.segments)
            log.debug("process group: sending to rank %d failed: %s", dst, e)

    def tell_members(self, group, extra):
        """Send header ``extra`` alone to every other member of ``group`` still up."""
        for r in group.ranks:
            if r != self.rank and self.transport.down(r) is None:
                self.send_message(r, extra, None)

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
        if self.callbacks is not None:
            self.callbacks.shutdown()
        if self.shm is not None:
            self.shm.close()
        if self._ipc_dir is not None:
            shutil.rmtree(self._ipc_dir, ignore_errors=True)


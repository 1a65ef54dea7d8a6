"""The ZeroMQ side of a process: its context, sockets and I/O thread. Whether its peers
are alive is ``liveness.py``'s, and where a message that came in goes is ``routing.py``'s,
both run on that I/O thread.

Sockets and the one thread that owns each:

==================  =====================================================  ==============
socket              job                                                    owner thread
==================  =====================================================  ==============
``router``          bound endpoint: every message addressed to this        the I/O thread
                    process comes in here (CALLs, replies, one-way)
``dealers[r]``      to peer ``r``: its liveness connection, which carries  the I/O thread
                    nothing but LEAVE and drops when ``r`` is silent for
                    the heartbeat bound
``monitors[r]``     connection events of ``dealers[r]`` (``liveness.py``)  the I/O thread
own sockets         a thread's own DEALER to peer ``r`` (to at most        that thread
                    ``OWN_SOCKETS_PER_THREAD`` peers; it relays the rest
                    through the I/O thread): the CALLs this
                    thread makes and the replies of the calls it serves;
                    the I/O thread's own carry what it sends itself
                    (replies of calls it serves, releases, collectives)
==================  =====================================================  ==============

In a world of more than :data:`WATCH_ALL_UP_TO` processes, connections are made when first
needed, so a process has sockets for the peers it talks to, not for the whole world:
rank 0 (which holds the shutdown barrier) watches every peer from the start, the others
rank 0, and a peer is watched (``dealers[r]``) from the first message to or from it. A
smaller world watches every peer from the start, and its I/O thread connects its own
socket to every peer then too: a few sockets buy first calls that need no handshake with
a liveness connection beside theirs, and a distributed backward's first gradients (which
the I/O thread sends, hop after hop) no handshake at all. A new connection's handshake
waits for the ZAP handler (authentication), which the I/O thread serves among its busy
sockets. Connections that carry messages outlast a network outage within
the heartbeat bound (TCP retransmits what was in flight); only the liveness connections
drop at the bound, so a dead peer is still reported within it.

A message leaves from the thread that produced it, on a socket that thread owns
(:meth:`Transport.send`): a caller's request from the caller's own socket, a
handler's reply from the handler's own socket. Nothing is handed to another thread
to be sent, and a socket is never shared: a thread's own sockets live in its
thread-local storage and are closed when the thread ends. Replies therefore come
in on the router, not on the socket their request left from, and the I/O thread
routes them to the pending call (``calls.py``). The hand-off count of each path is
in ``PROTOCOL.md``. The one exception: a request that did not come from a peer's
own socket (a client of another kind) is answered on the connection it came on,
which only the router's owner can do: such replies go through the outbox, a deque
plus an eventfd (a pipe where there is none) that wakes the I/O thread.

While messages flow, the I/O thread polls only the router, its wake-up and the ZAP
handler (a poll's cost grows with its sockets, and it is on the path of every message);
the monitors and the dealers are polled whenever traffic stops and at least every 10 ms.

The I/O thread never dies silently: an unexpected error stops it with
``on_fatal(cause)``, which fails every pending and future call, and the peers are
told it is leaving (a LEAVE, as a process that closes sends one).
"""
import collections
import errno
import logging
import os
import threading
import time

import zmq

from ..utils.addresses import endpoint_host, is_ipv6
from ..utils.lifetimes import join_all
from . import wire
from .admission import ZapHandler, new_identity, own_identity
from .credentials import Credential
from .errors import ProtocolError
from .frames import frames_nbytes, recv_frames, send_frames
from .link import SimulatedLink, parse_link
from .liveness import PeerLiveness
from .own_sockets import OwnSockets
from .routing import Routing
from .wakeup import Wakeup

__all__ = ["Transport"]

log = logging.getLogger("distgrad.rpc")
Kind = wire.Kind

_BATCH = 64               # messages taken from one socket before looking at the others
_LEAVE_LINGER = 100       # ms a LEAVE may take to reach a live peer when we close
# While messages flow, the I/O thread polls only the router, its wake-up and the ZAP handler:
# a poll's cost grows with its sockets (7 for two processes: ~6 us against ~1.6 us, and more
# once it blocks), and it is on the path of every message. ZAP is among them because every
# new connection's handshake waits for its answer (held back, a thread's first call to a
# peer took 10 ms instead of 1). The others (liveness monitors, the dealers) are looked at
# when traffic stops, and at least this often (seconds) meanwhile.
_QUIET_SOCKETS_EVERY = 0.01
#: Worlds up to this size watch every peer from the start; larger ones on first contact.
WATCH_ALL_UP_TO = 16
_POLLIN, _EVENTS = int(zmq.POLLIN), int(zmq.EVENTS)  # plain ints: enum arithmetic is slow


class Transport:
    """Sockets and I/O thread of one process; ``liveness`` (a :class:`PeerLiveness`)
    follows its peers on that thread. Callbacks run on the I/O thread:

    ``on_request(ident, msg_id, src, extra, segments, frames)`` a CALL arrived;
    ``on_system_request(...)`` (same arguments, optional) a SYSTEM call arrived: an
    internal operation served right there, on the I/O thread;
    ``on_reply(rank, kind, msg_id, extra, segments, frames)`` a REPLY or ERROR arrived;
    ``on_release(src, names)`` a peer released shared-memory segments;
    ``on_peer_down(rank, why, left)`` a peer died (``left=False``) or left;
    ``on_peer_up(rank)`` a peer reported down answers again;
    ``on_fatal(exc)`` the I/O thread stops because of ``exc``.

    With a ``credential`` (``credentials.py``) other than "none", the router admits only
    connections presenting a credential of the world's table (given to :meth:`connect`),
    each as the rank it registered, and a message whose header claims another rank than
    its connection's is refused. The ZAP handler is the I/O thread's: connections that
    come before the table is known wait for it.
    """

    def __init__(self, name, rank, world_size, options, handlers, credential=None):
        self.name, self.rank, self.world_size = name, rank, world_size
        self.options = options
        self.handlers = handlers
        self.credential = credential or Credential("none")
        self._verifiers = None
        self.zap = None            # the context's ZAP handler (admission.py), made at bind
        self.ctx = zmq.Context()
        self.stats = collections.Counter()
        self.routing = Routing(self)  # where what comes in on the router goes
        self._outbox = collections.deque()  # (router identity, frames) for the I/O thread
        self._relayed = collections.deque()  # (rank, frames) the I/O thread sends for others
        self._wake = Wakeup()
        # until when the I/O thread may sleep without looking at deadlines (see wake_by)
        self._asleep_until = float("inf")
        self._io_ident = None               # thread id of the I/O thread, once running
        self._one_core = False              # the process runs on one core (set at connect)
        # a network between hosts, simulated: messages from others are held on arrival
        self.link = SimulatedLink(*parse_link(options.simulated_link)) \
            if getattr(options, "simulated_link", None) else None
        self.liveness = PeerLiveness(rank, options, handlers)
        self.own_sockets = OwnSockets(self._own_socket, self.liveness.revivals)
        self._stop = False
        self._announce = None      # reason sent in LEAVE messages on close, if any
        self._closed = threading.Event()
        self._thread = None
        self.failure = None
        self.endpoints = None
        self.router = None
        self.dealers = {}          # rank -> liveness DEALER (I/O thread), made on first need
        self._dealer_rank = {}     # liveness DEALER -> rank
        self._io_socks = {}        # rank -> the I/O thread's own DEALER (messages it sends)
        self._io_revival = {}      # rank -> its revivals when that DEALER was made
        self._to_watch = collections.deque()  # ranks other threads started talking to
        self._poller = None
        self._first_watched = ()
        self._first_connected = ()

    # ------------------------------------------------------------------ setup
    def socket(self, kind, server=False, peer=None, carries_messages=True):
        """A socket with this transport's settings: the router (``server``), or a client
        to rank ``peer`` presenting this process's credential; one that carries no
        messages (a liveness connection) drops when the peer is silent for the bound."""
        s = self.ctx.socket(kind)
        s.linger = 0
        s.sndhwm = 0  # never block the I/O thread: backpressure is per call (calls.py)
        s.rcvhwm = 0
        self.liveness.set_heartbeats(s, carries_messages)
        if server:
            # The router sends no PINGs of its own: its connections still end when a peer's
            # socket goes silent for the TTL that socket announces, and libzmq 4.3 aborts
            # the process ("Assertion failed: !_io_error") when a PING timer fires on a
            # connection whose identity a reconnected peer took over (ROUTER_HANDOVER), as
            # after a network outage; seen here, with a link down for 2.7 s.
            s.heartbeat_ivl = 0
        s.reconnect_ivl = 100
        s.reconnect_ivl_max = 1000
        if server:
            self.credential.serve(s)
        elif peer is not None:
            for option, value in self.client_options(peer).items():
                setattr(s, option, value)
        return s

    def client_options(self, peer):
        """Socket options that present this process's credential to rank ``peer`` (a test
        that speaks the protocol by hand connects as this process with them)."""
        if self.credential.mechanism == "none":
            return {}
        return self.credential.client_options(self.rank, self._verifiers[peer])

    def bind(self, address):
        """Bind the router (``tcp://host:0`` or ``ipc://path``); return the real endpoint.

        The router never hands an identity over to a newer connection (ZeroMQ's default):
        a connection presenting an identity in use is never read, so a member that learnt
        another's identity cannot take its connection over (``admission.py``). Handing
        over served replies sent back on the connection a request came on; replies now
        travel from the callee's own socket to the caller's router, and the router
        answers only clients of another kind and refusals. A socket that reconnects
        presents its identity again, but only after its connection dropped for want of
        heartbeats, which the router's side (the socket's TTL) sees no later; liveness
        connections present no identity at all (the router numbers them)."""
        if self.credential.mechanism != "none" and self.zap is None:
            # bound before the router: libzmq refuses PLAIN clients while no handler is
            self.zap = ZapHandler(self.ctx, self.name, self.credential.mechanism,
                                  self.world_size)
        r = self.router = self.socket(zmq.ROUTER, server=True)
        r.router_mandatory = 1
        r.router_handover = 0
        r.maxmsgsize = self.options.max_message_size
        # peers that all connect at once (an all-to-all of 64 ranks: 63 peers' threads) can
        # overflow libzmq's default queue of 100; the kernel then drops their attempts,
        # which come back only after SYN retries (1 s, 3 s) and read as peers that never
        # answered
        r.backlog = 4096
        r.ipv6 = is_ipv6(address)
        r.bind(address)
        return r.last_endpoint.decode()

    def connect(self, endpoints, verifiers=None):
        """Know every peer's endpoint and start the I/O thread, which watches every peer
        at once in a small world, else rank 0 (rank 0: every peer) at once and the others
        from the first message to or from them.
        ``verifiers`` (rank -> what checks its credential) is the world's table from the
        rendezvous."""
        self.endpoints = list(endpoints)
        self.liveness.set_hosts([endpoint_host(ep) for ep in self.endpoints])
        if self.credential.mechanism != "none":
            if verifiers is None or len(verifiers) != self.world_size:
                raise ValueError("an authenticated transport needs every rank's verifier")
            self._verifiers = list(verifiers)
            self.zap.admit(verifiers)
        everyone = self.rank == 0 or self.world_size <= WATCH_ALL_UP_TO
        self._first_watched = range(self.world_size) if everyone else (0,)
        # a small world also connects the I/O thread's own sockets ahead of need: what it
        # sends (a distributed backward's gradients, hop after hop) does not wait for a
        # handshake on the first step (~1.5 ms a hop on a loaded host)
        self._first_connected = range(self.world_size) \
            if self.world_size <= WATCH_ALL_UP_TO else ()
        # pinned to one core (``distgrad worker --cpus``): see send()
        self._one_core = hasattr(os, "sched_getaffinity") and len(os.sched_getaffinity(0)) == 1
        self._thread = threading.Thread(target=self._run, name=f"rpc-io-{self.name}", daemon=True)
        self._thread.start()

    # ------------------------------------------------------------------ any thread
    def send(self, dst, frames):
        """Send a message to peer ``dst`` now, from the calling thread and on a socket it
        owns: the I/O thread's dealer on the I/O thread, else this thread's own socket to
        ``dst`` (made on first use). No thread hand-off. Returns False if it could not be
        sent (this side is closing, or the peer is gone)."""
        own = threading.get_ident() != self._io_ident
        if not own:
            revivals = self.liveness.revivals
            sock = self._io_socks.get(dst)
            if sock is None or (revivals and self._io_revival.get(dst) != revivals.get(dst)):
                sock = self.io_socket(dst)
        else:
            sock = self._thread_socket(dst)
            if sock is None:
                if self._closed.is_set() or self._stop:
                    self.stats["send_failed"] += 1
                    return False
                return self._relay(dst, frames)
        try:
            send_frames(sock, frames)
        except zmq.ZMQError as e:  # closing, or a peer that vanished: an expected event
            self.stats["send_failed"] += 1
            if e.errno != errno.EHOSTUNREACH:
                log.debug("%s: send to rank %d failed: %s", self.name, dst, e)
            return False
        self._count(frames)
        if own and self._one_core:
            # ZeroMQ's own I/O thread writes the message out, and on a process pinned to
            # one core it can only run when this thread blocks: a stage that sends a
            # gradient and goes on with its optimizer step held it back for the whole
            # step (the quickstart's gradient hop: 400 us, 220 us with this). Let it go
            # first; with nothing else to run here this returns at once.
            os.sched_yield()
        return True

    def connect_own_sockets(self):
        """Make the calling thread's own sockets now to the peers the I/O thread connects to
        ahead of need (every peer, in a small world): ``OwnSockets.connect_ahead``."""
        self.own_sockets.connect_ahead(r for r in self._first_connected if r != self.rank)

    def _thread_socket(self, dst):
        """The calling thread's own socket to ``dst`` (``own_sockets.py``); None when this
        side is closing or the thread keeps sockets to its share of peers already."""
        if self._closed.is_set() or self._stop:
            return None
        return self.own_sockets.get(dst)

    def connect_for_reply(self, ident, src):
        """The calling thread (a handler) is about to serve the request that came on
        connection ``ident`` from rank ``src``: make the socket its reply leaves from now,
        so that a new connection's handshake runs while the request does (a chain's
        first step paid one per hop otherwise). Nothing on the I/O thread, which replies
        at once, nor for a reply that goes back on the connection (``reply``)."""
        if threading.get_ident() != self._io_ident and ident is not None \
                and own_identity(ident, src):
            try:
                self._thread_socket(src)
            except zmq.ZMQError:  # closing meanwhile: the reply, if any, finds out itself
                pass

    def _relay(self, dst, frames):
        """Have the I/O thread send a message of a thread that talks to more peers than it
        keeps sockets for (one hand-off): a process's sockets stay within its threads times
        ``own_sockets.OWN_SOCKETS_PER_THREAD``, plus one per peer for the I/O thread."""
        self.stats["relayed"] += 1
        self._relayed.append((dst, frames))
        self._wake.signal()
        return True

    def _count(self, frames):
        # what crossed the wire (arrays in shared memory travel as a reference)
        stats = self.stats
        stats["messages_sent"] += 1
        stats["bytes_sent"] += frames_nbytes(frames)

    def reply(self, ident, src, frames):
        """Send a reply to the request that came on connection ``ident`` from rank ``src``:
        from this thread to ``src``'s router when ``ident`` is one of ``src``'s own sockets
        (the normal case, no hand-off), else back on that connection (through the outbox:
        only the I/O thread may use the router)."""
        if ident is not None and own_identity(ident, src):
            return self.send(src, frames)
        if threading.get_ident() == self._io_ident:
            self.send_router(ident, frames)
        else:
            self._outbox.append((ident, frames))
            self._wake.signal()
        return True

    def send_router(self, ident, frames):  # on the I/O thread
        try:
            send_frames(self.router, [ident, *frames])
        except zmq.ZMQError as e:  # a peer that vanished is an expected event
            self.stats["send_failed"] += 1
            if e.errno != errno.EHOSTUNREACH:
                log.debug("%s: reply on a connection failed: %s", self.name, e)
            return
        self._count(frames)

    def _own_socket(self, dst):
        s = self.socket(zmq.DEALER, peer=dst)
        # an identity of its own, shown to ``dst`` alone (admission.py); the rank in front
        # tells ``dst`` to reply to this process's router
        s.identity = new_identity(self.rank)
        s.ipv6 = is_ipv6(self.endpoints[dst])
        s.connect(self.endpoints[dst])
        if dst not in self.dealers and dst != self.rank:  # a peer we start talking to
            self._to_watch.append(dst)
            self._wake.signal()
        return s

    def io_socket(self, dst):
        """The I/O thread's own socket to ``dst`` (I/O thread only), made on first use, and
        made anew once ``dst`` came back after it was reported down (as a thread's own are, see
        ``own_sockets.py``)."""
        sock = self._io_socks.get(dst)
        revival = self.liveness.revivals.get(dst)
        if sock is not None and self._io_revival.get(dst) != revival:
            sock.close(linger=0)
            sock = None
        if sock is None:
            sock = self._io_socks[dst] = self._own_socket(dst)
            self._io_revival[dst] = revival
            self.watch(dst)
        return sock

    def watch(self, r):
        """Follow peer ``r``'s liveness (I/O thread): a DEALER that carries nothing, its
        connection events (``liveness.py``) and whatever stray arrives on it."""
        if r in self.dealers or r == self.rank or self._poller is None:
            return
        # no identity: one it presented again after a drop could meet its old connection,
        # not yet dropped on the peer's side, and would never be read (no handover)
        d = self.socket(zmq.DEALER, peer=r, carries_messages=False)
        monitor = self.liveness.watch(d, r, self.endpoints[r])
        d.ipv6 = is_ipv6(self.endpoints[r])
        d.connect(self.endpoints[r])
        self.dealers[r] = d
        self._dealer_rank[d] = r
        self._poller.register(d, zmq.POLLIN)
        self._poller.register(monitor, zmq.POLLIN)

    def follow(self, r):
        """Watch peer ``r``'s liveness from now on (any thread; the I/O thread starts soon),
        so that :meth:`down` reports its death although nothing is sent to it."""
        if r not in self.dealers and r != self.rank:
            self._to_watch.append(r)
            self._wake.signal()

    def on_io_thread(self):
        """Whether the calling thread is the I/O thread."""
        return threading.get_ident() == self._io_ident

    def wake(self):
        """Make the I/O thread run its ``on_tick`` soon (work was queued for it)."""
        self.stats["wakes"] += 1
        self._wake.signal()

    def wake_by(self, due):
        """A new deadline ``due`` (``time.monotonic()``) was added where the I/O thread
        looks for them: wake it only if it may sleep past it. Most deadlines are far
        (an RPC's timeout, a notice's 100 ms) and the I/O thread, which looks at them
        before each poll and polls for at most a second (10 ms while messages flow),
        would see them in time; a wake-up for every release notice cost every process of
        a distributed autograd step an extra pass of its loop (and the GIL). Called
        after the deadline was added: the I/O thread marks itself
        as deciding (``inf``) before it reads the deadlines, so either it reads the new
        one or this sees that it must wake it."""
        if due < self._asleep_until:
            self.wake()

    def down(self, rank):
        """Why peer ``rank`` cannot be reached (dead or left), or None."""
        return self.liveness.down(rank)

    def left(self, rank):
        """Whether peer ``rank`` left the world (said so) rather than died."""
        return self.liveness.left(rank)

    def running(self):
        return self._thread is not None and not self._closed.is_set()

    def drop(self, why):
        self.stats["dropped"] += 1
        log.debug("%s: dropped a message: %s", self.name, why)

    # ------------------------------------------------------------------ the I/O thread
    def _run(self):
        self._io_ident = threading.get_ident()
        try:
            self._loop()
        except BaseException as e:  # noqa: BLE001 - never die silently: say why, fail calls
            self.failure = e
            log.error("%s: the RPC I/O thread stopped: %s: %s", self.name, type(e).__name__, e,
                      exc_info=log.isEnabledFor(logging.DEBUG))
            self._announce = f"its RPC I/O thread stopped ({type(e).__name__}: {e})"
            try:
                self.handlers.on_fatal(e)
            except Exception:  # noqa: BLE001
                log.exception("%s: failing pending calls", self.name)
            try:  # tell the peers we are leaving, so they do not wait for us
                self._send_leave(self._announce)
            except Exception:  # noqa: BLE001 - the sockets themselves may be what failed
                pass
        finally:
            self._close_sockets()
            self._closed.set()

    def _loop(self):
        poller = self._poller = zmq.Poller()
        poller.register(self.router, zmq.POLLIN)
        wake_fd = self._wake.fd
        poller.register(wake_fd, zmq.POLLIN)
        dealer_rank = self._dealer_rank
        liveness = self.liveness
        monitors = liveness.monitors
        for r in self._first_watched:
            self.watch(r)
        for r in self._first_connected:
            if r != self.rank:
                self.io_socket(r)
        zap = self.zap.socket if self.zap is not None else None
        if zap is not None:
            poller.register(zap, zmq.POLLIN)
        busy = zmq.Poller()  # while messages flow (see _QUIET_SOCKETS_EVERY)
        busy.register(self.router, zmq.POLLIN)
        busy.register(wake_fd, zmq.POLLIN)
        if zap is not None:  # a peer's new connection waits for its answer: never held back
            busy.register(zap, zmq.POLLIN)
        all_due = 0.0  # until then, only the router and the wake-up are polled
        router, handlers = self.router, self.handlers
        while not self._stop:
            self._asleep_until = float("inf")  # deciding (wake_by)
            now = time.monotonic()
            wait = min(handlers.next_deadline(), liveness.next_deadline(now + 1.0),
                       self.link.next_due if self.link is not None else now + 1.0) - now
            busy_only = now < all_due
            if busy_only:
                # what came meanwhile to the others waits for the next full poll, whose
                # first pass sees it (zmq_poll asks each socket before it blocks)
                wait = min(wait, all_due - now)
            timeout_ms = max(0, int(wait * 1000) + 1)
            self._asleep_until = now + timeout_ms / 1000.0
            if busy_only:
                events = busy.poll(timeout_ms)
            else:
                events = poller.poll(timeout_ms)
                all_due = time.monotonic() + _QUIET_SOCKETS_EVERY if events else 0.0
            if any(s == wake_fd for s, _ in events):
                self._wake.clear()  # clear first, then look at the work: a later wake signals
            while self._outbox:
                self.send_router(*self._outbox.popleft())
            while self._relayed:
                self.send(*self._relayed.popleft())
            while self._to_watch:
                self.watch(self._to_watch.popleft())
            for sock, _ in events:
                if sock is router:
                    self._guarded(self._on_router)
                elif sock in dealer_rank:
                    self._guarded(self._on_dealer, sock, dealer_rank[sock])
                elif sock in monitors:
                    self._guarded(liveness.on_monitor, sock)
                elif sock is zap:
                    self._guarded(self.zap.serve)
            now = time.monotonic()
            if self.link is not None:
                self.link.release(now)
            liveness.expire(now)
            handlers.on_tick(now)
        while self._outbox:
            self.send_router(*self._outbox.popleft())
        while self._relayed:
            self.send(*self._relayed.popleft())
        if self._announce is not None:
            self._send_leave(self._announce)

    def _guarded(self, handle, *args):
        """Handle what one socket holds; an error caused by one message loses that message
        only (counted and logged), never the I/O thread."""
        try:
            handle(*args)
        except (MemoryError, SystemError, KeyboardInterrupt):
            raise
        except Exception as e:  # noqa: BLE001
            self.stats["handler_errors"] += 1
            log.warning("%s: a message could not be handled and was dropped: %s: %s", self.name,
                        type(e).__name__, e, exc_info=log.isEnabledFor(logging.DEBUG))

    def _incoming(self, sock, header_at):
        """(frames, kind, msg_id, src, extra, segments) of up to _BATCH waiting messages."""
        for _ in range(_BATCH):
            # asking is cheaper than the exception an empty socket raises
            if not sock.getsockopt(_EVENTS) & _POLLIN:
                return
            frames = recv_frames(sock)
            if len(frames) < header_at + 2:
                self.drop(f"{len(frames)} frames")
                continue
            try:
                kind, mid, src, extra, segments = wire.unpack_header(frames[header_at].bytes)
            except ProtocolError as e:
                self.drop(str(e))
                continue
            yield frames, kind, mid, src, extra, segments

    def _on_router(self):
        link, route = self.link, self.routing.route
        for message in self._incoming(self.router, 1):
            src = message[3]
            if link is not None and src != self.rank and 0 <= src < self.world_size:
                due = link.arrival(src, frames_nbytes(message[0][1:]), time.monotonic())
                link.hold(due, self._guarded, route, *message)
            else:
                route(*message)

    def _on_dealer(self, sock, rank):
        # Peers send everything to the router; a router sends nothing back on a
        # connection, so whatever arrives here is not from a peer that follows the protocol.
        for frames, kind, _, _, _, segments in self._incoming(sock, 0):
            self.drop(f"{Kind.NAMES.get(kind, kind)} on a dealer socket")
            self.handlers.on_late(rank, segments)

    def _send_leave(self, why):
        header = wire.pack_header(Kind.LEAVE, 0, self.rank, why)
        for r, d in list(self.dealers.items()):
            if r != self.rank and self.liveness.down(r) is None:
                try:
                    d.send_multipart([header, b""], zmq.NOBLOCK)
                except zmq.ZMQError:
                    pass

    def _close_sockets(self):
        # let the last replies (router) and LEAVE (dealers) out; a LEAVE to a peer that is
        # already gone would wait for the whole linger, so the dealers' is short
        linger = 1000 if self._announce is not None else 0
        self.liveness.close()
        for s in [*self.liveness.monitors, self.router, self.zap and self.zap.socket]:
            if s is not None and not s.closed:
                s.close(linger=linger)
        for r, d in [*self.dealers.items(), *self._io_socks.items()]:
            if not d.closed:
                d.close(linger=0 if self.liveness.down(r) is not None
                        else min(linger, _LEAVE_LINGER))

    # ------------------------------------------------------------------ closing
    def close(self, announce=None, timeout=10.0):
        """Stop the I/O thread (after it sent what is queued and, with ``announce``, a
        LEAVE to every peer), then destroy the context. Safe to call twice."""
        if self._thread is not None and self._thread.is_alive():
            if announce is not None and self._announce is None:
                self._announce = announce
            self._stop = True
            self._wake.signal()
            join_all([self._thread], timeout, f"RPC transport of {self.name}")
        elif self._thread is None:
            self._close_sockets()
        self.ctx.destroy(linger=0)
        self._wake.close()

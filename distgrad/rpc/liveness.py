"""Whether each peer of a process is alive, dead or gone: ZMTP heartbeats and the
connection events of the transport's dealers.

Liveness does not need the GIL: ZeroMQ's own ZMTP heartbeats
(``HEARTBEAT_IVL``/``_TIMEOUT``/``_TTL``) are answered by libzmq's I/O thread, so
a process busy in Python or in a long C call stays alive to its peers. A connection
that drops meanwhile (a network blip; a peer that was itself stopped past the bound) is
admitted again only by ZAP, in Python, so its reconnection waits for the busy process's
GIL, as a stopped process's would wait forever; while it waits, this side asks the
peer's ZeroMQ directly (``greeting.py``: libzmq's own thread greets every connection)
and waits as long as it answers, however long the GIL is held. What this side sees
through a dealer's monitor:

* a killed peer: the connection drops and reconnecting is refused at once, so
  it is reported dead within ~0.2 s;
* a stopped (or unreachable) peer: heartbeats go unanswered for
  ``heartbeat_timeout - grace``, the connection drops, and the reconnection
  never completes its handshake: reported dead after ``heartbeat_timeout``;
* a peer that drops its connection but comes back within ``grace`` (a process
  resumed after a stop reconnects at once), or whose ZeroMQ greets a probe every
  ``grace`` until it does (a process holding its GIL), is never reported at all; one
  that comes back later is reported alive again.

A process that leaves sends LEAVE first, so its peers report a clean departure,
not a death; the calls still pending to it fail ``grace`` later, since the replies
it sent before its LEAVE travel on another connection.

:class:`PeerLiveness` is the transport's (``transport.py``) and runs on its I/O thread:
the transport polls the monitors, hands their events and LEAVE messages over, includes
:meth:`PeerLiveness.next_deadline` in its poll's wait and calls
:meth:`PeerLiveness.expire` after each poll. What it finds goes to the transport's
handlers: ``on_peer_down(rank, why, left)`` and ``on_peer_up(rank)``.
"""
import time

import zmq

from ..utils.socket_monitor import recv_monitor_event
from .greeting import GreetingProbe

__all__ = ["PeerLiveness"]

_BATCH = 64  # events taken from one monitor before looking at the other sockets
_MONITORED = (zmq.EVENT_HANDSHAKE_SUCCEEDED | zmq.EVENT_DISCONNECTED | zmq.EVENT_CLOSED
              | zmq.EVENT_CONNECTED | zmq.EVENT_HANDSHAKE_FAILED_AUTH)


class PeerLiveness:
    """The liveness of the peers of process ``rank``, from ``options``' heartbeat
    settings; reports go to ``handlers``. Everything runs on the transport's I/O thread
    except :meth:`down` and :meth:`left`, which any thread may ask."""

    def __init__(self, rank, options, handlers):
        self.rank = rank
        self.options = options
        self.handlers = handlers
        self.grace = max(0.5, options.heartbeat_interval)
        # how long a first handshake may take once the peer's host accepted the connection
        self._admission = max(4 * options.heartbeat_timeout, 10.0)
        # libzmq drops a silent connection within an interval and its own timeout; the
        # grace given to a reconnection completes heartbeat_timeout
        zmtp_timeout = max(options.heartbeat_timeout - self.grace - options.heartbeat_interval,
                           options.heartbeat_interval)
        self._hb = (int(options.heartbeat_interval * 1000), int(zmtp_timeout * 1000),
                    int(options.heartbeat_timeout * 1000))
        # Connections that carry messages outlast a network outage as long as the bound and
        # TCP's retransmissions after it, which back off exponentially (an outage of t s is
        # over for TCP by about 2t + 0.2 s): dropping one would lose what was in flight.
        # Only the liveness connections (which carry nothing) drop at the bound.
        lasting = int((2 * options.heartbeat_timeout + 1.0) * 1000)
        # They PING once a bound, not every interval: they only need to drop (on both sides,
        # by the TTL they announce) some time after a long outage, and each PING costs ~40 us
        # of libzmq's thread. After an all-to-all of 64 ranks every process holds ~3 such
        # connections per peer; at the liveness interval their PINGs alone kept a third of
        # a 2-core machine busy.
        self._hb_data = (int(options.heartbeat_timeout * 1000), lasting, lasting)
        self._down = {}            # rank -> why (dead or left); read by any thread
        self._left = set()
        self._suspect = {}         # rank -> deadline
        self._refused = {}         # rank -> reconnections refused in a row
        self._leaving = {}         # rank -> (when its pending calls fail, why) after a LEAVE
        self._silent = set()       # ranks reported dead for want of heartbeats
        self._probation = set()    # ranks watched whose first handshake has not succeeded
        self._mates = {}           # rank -> the other ranks on its host (none on one host)
        self._host = {}            # rank -> its host
        self.monitors = {}         # monitor socket -> the rank its dealer goes to
        self._monitor_of = {}      # rank -> its monitor socket
        #: rank -> how often it answered again after being reported down (read by any
        #: thread: the transport replaces its sockets to a peer that came back)
        self.revivals = {}
        self._endpoints = {}       # rank -> its endpoint (for greeting probes)
        self._probes = {}          # rank -> GreetingProbe while its reconnection waits

    def set_hosts(self, hosts):
        """The host of each rank (``hosts[rank]``; None: unknown or this machine's), so
        that a host that goes silent as a whole is reported as such, with all its ranks."""
        by_host = {}
        if len({h for h in hosts if h is not None}) < 2:
            return  # one host: a silent peer is a silent process
        for r, h in enumerate(hosts):
            if h is not None and r != self.rank:
                by_host.setdefault(h, []).append(r)
        self._mates = {r: [m for m in ranks if m != r] for ranks in by_host.values()
                       for r in ranks}
        self._host = {r: h for r, h in enumerate(hosts)}

    def set_heartbeats(self, sock, carries_messages=True):
        """Turn on ZMTP heartbeats on ``sock`` (every socket of the transport has them):
        a socket that ``carries_messages`` keeps its connections through an outage within
        the bound; a liveness connection (``watch``) drops when its peer is silent."""
        ivl, timeout, ttl = self._hb_data if carries_messages else self._hb
        sock.heartbeat_ivl, sock.heartbeat_timeout, sock.heartbeat_ttl = ivl, timeout, ttl

    def watch(self, dealer, rank, endpoint=None):
        """Follow the connection events of ``dealer`` (to ``rank`` at ``endpoint``), a
        connection that carries no messages; call before it connects. Another process is on
        probation until its handshake succeeds: reported dead if that takes
        ``heartbeat_timeout``, unless its host accepted the connection meanwhile (see
        ``on_monitor``)."""
        mon = dealer.get_monitor_socket(_MONITORED)
        self.monitors[mon] = rank
        self._monitor_of[rank] = mon
        if endpoint is not None:
            self._endpoints[rank] = endpoint
        if rank != self.rank:
            self._suspect[rank] = time.monotonic() + self.options.heartbeat_timeout
            self._probation.add(rank)
        return mon

    def down(self, rank):
        """Why peer ``rank`` cannot be reached (dead or left), or None."""
        return self._down.get(rank)

    def left(self, rank):
        """Whether peer ``rank`` left the world (said so) rather than died."""
        return rank in self._left

    def next_deadline(self, later):
        """When :meth:`expire` has something to do, or ``later`` if that is sooner."""
        if not self._suspect and not self._leaving:
            return later
        return min(later, *self._suspect.values(), *(t for t, _ in self._leaving.values()))

    def expire(self, now):
        """Report the peers whose deadline passed: suspects as dead, leavers as left."""
        for r, deadline in list(self._suspect.items()):
            if now < deadline or r not in self._suspect:
                continue
            # what its connection said meanwhile first: while messages flow the monitors
            # are polled only now and then, and a busy process reads them late
            mon = self._monitor_of.get(r)
            if mon is not None:
                self.on_monitor(mon)
            if r in self._suspect and now >= self._suspect[r]:
                probe = self._probes.pop(r, None)
                if probe is not None and probe.answered():
                    # its ZeroMQ runs: a process that holds its GIL admits the reconnection
                    # when it lets go; ask again a grace later
                    self._suspect[r] = now + self.grace
                    self._probe(r)
                    continue
                if probe is not None:
                    probe.close()
                self._expire_silent(r)
        for r, (deadline, why) in list(self._leaving.items()):
            if now >= deadline:
                del self._leaving[r]
                self.handlers.on_peer_down(r, why, True)

    def _expire_silent(self, rank):
        """Report ``rank`` dead for want of heartbeats; where every other rank of its host
        is silent too (their connections dropped, or already reported so), the host is
        down or cut off: all of them are reported now, each naming the host and its ranks."""
        if rank in self._probation:
            silence = (f"no connection completed within {self.options.heartbeat_timeout:.1f} "
                       "s of the first attempt")
        else:
            silence = f"no heartbeat for {self.options.heartbeat_timeout:.1f} s"
        mates = self._mates.get(rank, [])
        quiet = [m for m in mates if m in self._suspect or m in self._silent]
        if not mates or len(quiet) < len(mates):
            del self._suspect[rank]
            self._silent.add(rank)
            self._peer_down(rank, silence, left=False)
            return
        ranks = sorted([rank, *mates])
        why = (f"{silence}, nor from any rank of its host {self._host[rank]} (ranks "
               f"{', '.join(map(str, ranks))}): the host is down or cut off from this one")
        for r in [rank, *(m for m in quiet if m in self._suspect)]:
            del self._suspect[r]
            self._silent.add(r)
            self._peer_down(r, why, left=False)

    def on_leave(self, rank, why):
        """Peer ``rank`` said it leaves the world, because ``why``."""
        self._suspect.pop(rank, None)
        self._peer_down(rank, why, left=True)

    def on_monitor(self, mon):
        """Take in the waiting connection events of monitor ``mon``."""
        rank = self.monitors[mon]
        for _ in range(_BATCH):
            try:
                event, _ = recv_monitor_event(mon, zmq.NOBLOCK)
            except zmq.Again:
                return
            if rank in self._left:
                continue
            if event == zmq.EVENT_HANDSHAKE_SUCCEEDED:
                self._suspect.pop(rank, None)
                self._end_probe(rank)
                self._refused.pop(rank, None)
                self._silent.discard(rank)
                self._probation.discard(rank)
                if rank in self._down:
                    self.revivals[rank] = self.revivals.get(rank, 0) + 1
                    del self._down[rank]
                    self.handlers.on_peer_up(rank)
            elif event == zmq.EVENT_DISCONNECTED:
                if rank not in self._down:
                    self._suspect.setdefault(rank, time.monotonic() + self.grace)
                    if rank not in self._probation:
                        self._probe(rank)
            elif event == zmq.EVENT_CONNECTED:
                self._refused.pop(rank, None)
                if rank in self._probation and rank in self._suspect:
                    # its host accepted the connection: the process listens, and a busy one
                    # (many processes per core forming a world) admits it late, in Python
                    self._suspect[rank] = max(self._suspect[rank],
                                              time.monotonic() + self._admission)
            elif event == zmq.EVENT_HANDSHAKE_FAILED_AUTH:
                self._suspect.pop(rank, None)
                self._peer_down(rank, "it refused this process's credentials (is it a member "
                                      "of another world?)", left=False)
            elif event == zmq.EVENT_CLOSED and rank in self._suspect:
                # reconnections refused twice in a row (once can be the old connection
                # closing): nobody listens on the peer's endpoint any more
                self._refused[rank] = self._refused.get(rank, 0) + 1
                if self._refused[rank] >= 2:
                    del self._suspect[rank]
                    self._peer_down(rank, "its process is gone (connection refused)",
                                    left=False)

    def _probe(self, rank):
        """Ask ``rank``'s ZeroMQ whether it runs (read when its deadline passes)."""
        endpoint = self._endpoints.get(rank)
        if endpoint is not None and rank not in self._probes:
            self._probes[rank] = GreetingProbe(endpoint)

    def _end_probe(self, rank):
        probe = self._probes.pop(rank, None)
        if probe is not None:
            probe.close()

    def close(self):
        """Close what this side still asks (the transport closes the monitors)."""
        for rank in list(self._probes):
            self._end_probe(rank)

    def _peer_down(self, rank, why, left):
        self._end_probe(rank)
        if left:
            self._left.add(rank)
        elif rank in self._down:
            return
        self._down[rank] = why  # from now on new calls to it fail
        if left and rank not in self._leaving:
            # A peer that leaves answered what it will answer before saying so, but those
            # replies travel on another connection: wait a moment before failing the rest.
            self._leaving[rank] = (time.monotonic() + self.grace, why)
        elif not left:
            self.handlers.on_peer_down(rank, why, left)

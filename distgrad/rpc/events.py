"""What the transport hears, routed to the part whose job it is (all on the I/O thread).

=====================  =========================================================
event                  goes to
=====================  =========================================================
a CALL                 its notices to ``bookkeeping``; the request to the dispatcher
a SYSTEM call          the same, served right there by the dispatcher
a REPLY or ERROR       its notices to ``bookkeeping``; the reply to the caller
a RELEASE, a drop      the shared-memory segments they name, to ``same_host``
a peer down            the caller (its calls fail), ``same_host``, ``bookkeeping``,
                       the owner table, then the peer listeners (on handler threads)
a fatal error          the caller: every call fails, later ones too
a tick                 expiries (calls, owner entries); segment releases and notices
                       that waited long enough leave on their own; shared-memory
                       probes of peers that large arrays went to
=====================  =========================================================

Nothing here blocks: the I/O thread also answers the sockets.
"""
import logging

from . import wire
from .bookkeeping import EXTRA as BOOKKEEPING
from .caller import NO_REPLY
from .dispatch import Request
from .errors import RpcError

__all__ = ["Events"]

log = logging.getLogger("distgrad.rpc")
Kind = wire.Kind


class Events:
    """The transport's handlers (see :class:`~distgrad.rpc.transport.Transport`) of one
    process. Made before the transport (which needs them) with what exists then: ``name``,
    ``rank``, ``state`` (``closing``, ``quiet``), ``bookkeeping``, ``owner`` (the
    :class:`~distgrad.rpc.owner.OwnerTable`) and ``peer_listeners`` (a list of
    ``fn(rank, why, left)``); the parts made once the transport exists are given by
    :meth:`route`, once, before the transport's I/O thread starts."""

    def __init__(self, name, rank, state, bookkeeping, owner, peer_listeners):
        self.name, self.rank, self.state = name, rank, state
        self.bookkeeping, self.owner = bookkeeping, owner
        self.peer_listeners = peer_listeners
        self.members = self.transport = self.caller = self.dispatcher = None
        self.same_host = self.pool = None

    def route(self, members, transport, caller, dispatcher, same_host, pool):
        """Where events go: ``members`` (:class:`~distgrad.rpc.members.Members`), the
        ``transport`` itself (liveness, and sending notices that had no ride), ``caller``
        (:class:`~distgrad.rpc.caller.Caller`), ``dispatcher``, ``same_host``
        (:class:`~distgrad.rpc.shm.SameHost`) and ``pool`` (peer listeners run there)."""
        self.members, self.transport, self.caller = members, transport, caller
        self.dispatcher, self.same_host, self.pool = dispatcher, same_host, pool

    # ------------------------------------------------------------------ messages
    def on_request(self, ident, mid, src, extras, segments, frames):
        self._receive_bookkeeping(src, extras)
        self.dispatcher.submit(self._request(ident, mid, src, extras, segments), frames)

    def on_system_request(self, ident, mid, src, extras, segments, frames):
        self._receive_bookkeeping(src, extras)
        self.dispatcher.serve_here(self._request(ident, mid, src, extras, segments), frames)

    def _request(self, ident, mid, src, extras, segments):
        return Request(ident, mid, src, self.members.workers[src], extras, segments)

    def on_reply(self, rank, kind, mid, extras, segments, frames):
        self._receive_bookkeeping(rank, extras)
        self.caller.on_reply(rank, kind, mid, extras, segments, frames)

    def on_late(self, src, segments):
        self.same_host.settle(src, segments)

    def on_release(self, src, names):
        self.same_host.released(src, names)

    def _receive_bookkeeping(self, src, extras):
        box = extras.get(BOOKKEEPING) if type(extras) is dict else None
        if box is None:
            return
        try:
            self.bookkeeping.receive(src, box)
        except Exception as e:  # noqa: BLE001 - notices are lost, the message is not
            self.transport.stats["handler_errors"] += 1
            log.warning("%s: bookkeeping from %s: %s: %s", self.name,
                        self.members.describe(src), type(e).__name__, e)

    # ------------------------------------------------------------------ peers
    def on_peer_down(self, rank, why, left):
        failed = self.caller.drop_calls_to(rank)
        self.same_host.peer_gone(rank)
        self.bookkeeping.forget_peer(rank)
        self.owner.forget_peer(rank)
        quiet = self.state.quiet
        level = logging.DEBUG if quiet else logging.WARNING
        pending = f"; {len(failed)} pending calls to it failed" if failed else ""
        described = self.members.describe(rank)
        if left:
            log.log(logging.DEBUG if quiet else logging.INFO, "%s: %s left the world (%s)%s",
                    self.name, described, why, pending)
        else:
            log.log(level, "%s: %s is unreachable: %s%s", self.name, described, why, pending)
        self.caller.fail_dropped(rank, why, failed)
        for fn in self.peer_listeners:
            self.pool.submit(fn, rank, why, left)

    def on_peer_up(self, rank):
        log.warning("%s: %s answers again", self.name, self.members.describe(rank))

    def on_fatal(self, exc):
        err = RpcError(f"RPC agent {self.name!r} stopped: its I/O thread failed with "
                       f"{type(exc).__name__}: {exc}")
        self.state.closing = str(err)
        self.caller.fail_all(err)

    # ------------------------------------------------------------------ time
    def next_deadline(self):
        return min(self.caller.next_deadline, self.owner.next_expiry,
                   self.bookkeeping.next_due, self.dispatcher.next_check)

    def on_tick(self, now):
        self.caller.expire(now)
        self.dispatcher.on_tick(now)
        if now >= self.owner.next_expiry:
            self.owner.expire(now)
        if self.same_host.has_wanted():  # peers a large array went to: may they map ours?
            self.same_host.probe_wanted(self.caller)
        if self.same_host.has_releases():  # segments this process no longer maps: to lenders
            for src, names in self.same_host.take_releases().items():
                self.bookkeeping.post(src, "shm.release", names)
        for dst, box in self.bookkeeping.due(now):  # nothing gave them a ride: on their own
            if self.transport.down(dst) is None:
                header = wire.pack_header(Kind.SYSTEM, NO_REPLY, self.rank, {BOOKKEEPING: box})
                body, _ = wire.encode(["@bk", [], {}, None])
                self.transport.send(dst, [header, body])

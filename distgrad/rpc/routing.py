"""Where a message that came in on a process's router goes, by its kind, and what is
refused there (on the transport's I/O thread).

The transport (``transport.py``) owns the sockets and reads the messages;
:class:`Routing` looks at each one's header: a source outside the world, or one that its
connection does not belong to (``admission.py``), is refused (a CALL gets a
``ProtocolError`` back at once); a peer heard from for the first time is watched; the
rest goes to the transport's handlers (``events.py``): CALLs, SYSTEM calls, replies,
shared-memory releases, and LEAVE to the liveness of the peers.
"""
from . import wire
from .admission import own_identity, router_numbered
from .errors import ProtocolError, describe_exception

__all__ = ["Routing"]

Kind = wire.Kind


class Routing:
    """The routing of ``transport``'s router messages (see the module docstring)."""

    def __init__(self, transport):
        self.transport = transport
        self._on_system = getattr(transport.handlers, "on_system_request", None)

    def route(self, frames, kind, mid, src, extra, segments):
        """Hand one message that came in on the router to its handler."""
        t = self.transport
        h = t.handlers
        if not 0 <= src < t.world_size:
            self.refuse(frames[0].bytes, kind, mid, f"source rank {src} is not in the world of "
                                                    f"{t.world_size} processes")
            h.on_late(None, segments)
            return
        if t.zap is not None and (why := t.zap.impostor(frames, src)) is not None:
            self.refuse(frames[0].bytes, kind, mid, why)
            h.on_late(None, segments)
            return
        if src not in t.dealers and src != t.rank:  # a peer that starts talking to us
            t.watch(src)
        if kind == Kind.CALL:
            h.on_request(frames[0].bytes, mid, src, extra, segments, frames[2:])
        elif kind == Kind.REPLY or kind == Kind.ERROR:
            h.on_reply(src, kind, mid, extra, segments, frames[2:])
        elif kind == Kind.SYSTEM and self._on_system is not None:
            self._on_system(frames[0].bytes, mid, src, extra, segments, frames[2:])
        elif kind in (Kind.RELEASE, Kind.LEAVE) and t.zap is None \
                and not (own_identity(ident := frames[0].bytes, src) or router_numbered(ident)):
            # one-way messages come from the peer's own sockets or its liveness connection
            t.drop(f"{Kind.NAMES[kind]} claiming rank {src} from another connection")
        elif kind == Kind.RELEASE:
            h.on_release(src, segments)
        elif kind == Kind.LEAVE:
            why = extra if isinstance(extra, str) else "it left the world"
            t.liveness.on_leave(src, why[:500])
        else:
            t.drop(f"{Kind.NAMES.get(kind, kind)} on the request socket")
            h.on_late(src, segments)

    def refuse(self, ident, kind, mid, why):
        """Drop a message that came on connection ``ident``; a CALL expecting an answer (a
        readable header promises one) gets a ``ProtocolError`` saying ``why``, on that
        connection: its sender learns at once instead of waiting out its timeout."""
        t = self.transport
        t.drop(why)
        if mid != 0 and kind in (Kind.CALL, Kind.SYSTEM):
            body, _ = wire.encode(describe_exception(ProtocolError(f"{t.name} refused the "
                                                                   f"message: {why}"), ""))
            t.send_router(ident, [wire.pack_header(Kind.ERROR, mid, t.rank), body])

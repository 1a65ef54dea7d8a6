"""The ZAP side of a world (RFC 27): which rank, if any, a connection's credentials prove,
and the handler socket libzmq asks, served by the transport's I/O thread; and which
routing identities a rank's connections may present.

Connections are authenticated, not messages (see ``credentials.py``): once admitted, a
connection's messages carry the rank it was admitted as (its ``User-Id``), and
:meth:`ZapHandler.impostor` says when a message's header claims another, or when its
connection presents a routing identity that is not of that rank's form.

Routing identities: each socket a process connects to a peer presents one of its own,
``b"<rank>:<24 random hex digits>"`` (:func:`new_identity`), drawn for that socket alone,
so an identity a peer sees is never presented to any other process and cannot be
guessed; its liveness connections present none (the router numbers them). The identity
cannot be bound in the ZAP answer itself: RFC 27 means its identity frame to be the
client's, but libzmq (4.3.5) puts the *server* socket's own routing identity there, and
asks before the client's metadata (which carries its identity) has arrived. So it is
bound in two places instead: routers never hand an identity over to a newer connection
(``ROUTER_HANDOVER`` off: a second connection presenting an identity in use is never
read, so it takes nothing over), and every message of a connection whose identity is
neither router-numbered nor of its admitted rank's form is refused.
"""
import functools
import hashlib
import hmac
import logging
import os
import re

import zmq
from zmq.utils import z85

__all__ = ["Admission", "ZapHandler", "ZAP_ENDPOINT", "new_identity", "own_identity",
           "router_numbered"]

log = logging.getLogger("distgrad.rpc")

ZAP_ENDPOINT = "inproc://zeromq.zap.01"  # where libzmq asks a context's ZAP handler
_BATCH = 64  # requests answered before the I/O thread looks at its other sockets
_TAG_BYTES = 12  # random bytes of a routing identity (hex: 24 digits)
_TAG = re.compile(rb"[0-9a-f]{%d}" % (2 * _TAG_BYTES))


def new_identity(rank):
    """A fresh routing identity for a socket of rank ``rank``: ``b"<rank>:<hex>"``."""
    return b"%d:%s" % (rank, os.urandom(_TAG_BYTES).hex().encode())


@functools.lru_cache(maxsize=4096)  # asked twice per request; a process sees few identities
def own_identity(ident, rank):
    """Whether routing identity ``ident`` has the form of rank ``rank``'s sockets'."""
    prefix = b"%d:" % rank
    return len(ident) == len(prefix) + 2 * _TAG_BYTES and ident.startswith(prefix) \
        and _TAG.fullmatch(ident, len(prefix)) is not None


def router_numbered(ident):
    """Whether ``ident`` is one the router made up (its client presented none): libzmq's
    start with a zero byte, which no socket of a world presents."""
    return ident[:1] == b"\0"


class Admission:
    """The ZAP side: which rank, if any, a connection's credentials prove. Made with the
    world's table of verifiers (rank -> verifier) once the rendezvous answered."""

    def __init__(self, name, mechanism, verifiers):
        self.name, self.mechanism = name, mechanism
        self._verifiers = list(verifiers)
        self._by_key = {v: r for r, v in enumerate(self._verifiers)} \
            if mechanism == "curve" else {}
        self.refused = 0

    def answer(self, request):
        """The ZAP reply frames (after the envelope) to ``request`` (the frames after it)."""
        if len(request) < 6:
            return None  # not a ZAP request: libzmq never sends one
        version, request_id, _domain, address, _identity, mechanism = request[:6]
        credentials = request[6:]
        try:
            rank, why = self._admit(mechanism, credentials)
        except Exception as e:  # noqa: BLE001 - refused, never left waiting for an answer
            rank, why = None, f"credentials that could not be checked ({type(e).__name__})"
        if rank is None:
            self.refused += 1
            level = logging.WARNING if self.refused <= 10 else logging.DEBUG
            log.log(level, "%s: refused a connection from %s: %s", self.name,
                    address.decode(errors="replace") or "a local peer", why)
            return [b"1.0", request_id, b"400", why.encode()[:255], b"", b""]
        return [b"1.0", request_id, b"200", b"OK", b"%d" % rank, b""]

    def _admit(self, mechanism, credentials):
        if mechanism.decode(errors="replace").lower() != self.mechanism:
            return None, (f"it authenticates with {mechanism.decode(errors='replace')}, this "
                          f"world with {self.mechanism}")
        if self.mechanism == "plain":
            if len(credentials) != 2:
                return None, "malformed PLAIN credentials"
            user, password = credentials
            try:
                rank = int(user)
            except ValueError:
                rank = -1
            if not 0 <= rank < len(self._verifiers) or user != b"%d" % rank:
                return None, f"it claims to be {user[:32]!r}, not a rank of this world"
            digest = hashlib.sha256(password).hexdigest()
            if not hmac.compare_digest(digest, self._verifiers[rank] or ""):
                return None, f"wrong credentials for rank {rank} (not a member of this world)"
            return rank, None
        if len(credentials) != 1 or len(credentials[0]) != 32:
            return None, "malformed CURVE credentials"
        rank = self._by_key.get(z85.encode(credentials[0]).decode())
        if rank is None:
            return None, "its CURVE key is not one of this world's members"
        return rank, None


class ZapHandler:
    """The ZAP handler socket of one transport's context, owned by its I/O thread. Bound
    before the router (libzmq refuses PLAIN clients while no handler is); connections
    that come before the world's verifiers are known (:meth:`admit`) wait for them."""

    def __init__(self, ctx, name, mechanism, world_size):
        self.name, self.mechanism = name, mechanism
        self.admission = None
        self._user_ids = ["%d" % r for r in range(world_size)]
        self.socket = ctx.socket(zmq.ROUTER)
        self.socket.linger = 0
        self.socket.bind(ZAP_ENDPOINT)

    def admit(self, verifiers):
        """From now on admit the connections ``verifiers`` (rank -> verifier) check."""
        self.admission = Admission(self.name, self.mechanism, verifiers)

    def serve(self):
        """Answer libzmq's waiting ZAP requests (I/O thread): admit a connection as the
        rank its credential proves, or refuse it."""
        sock = self.socket
        for _ in range(_BATCH):
            try:
                request = sock.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            if b"" not in request:
                continue
            envelope = request[:request.index(b"") + 1]
            answer = self.admission.answer(request[len(envelope):])
            if answer is not None:
                sock.send_multipart(envelope + answer, zmq.NOBLOCK)

    def impostor(self, frames, src):
        """Why the message ``frames`` (as the router received them) may not claim rank
        ``src`` (None: it may): its connection was admitted as another rank, or presents a
        routing identity that is not of ``src``'s form (another rank's, say: a member
        trying to pass for another at a third)."""
        try:
            user = frames[1].get("User-Id")
        except zmq.ZMQError:  # admitted by no ZAP handler
            user = None
        if user != self._user_ids[src]:
            return (f"it claims to come from rank {src}, but its connection was admitted as "
                    f"rank {user}")
        ident = frames[0].bytes
        if router_numbered(ident) or own_identity(ident, src):
            return None
        return (f"its connection was admitted as rank {src} but presents the routing identity "
                f"{ident[:40]!r}, which is not of the form of rank {src}'s sockets")

"""Rendezvous: every process registers (name, rank, endpoint); rank 0 serves the table.

The rendezvous address comes from ``init_method`` (``tcp://host:port`` or
``ipc:///path``) or, for ``env://``, from ``DISTGRAD_COORDINATOR`` or
``MASTER_ADDR``/``MASTER_PORT``. Rank 0 binds it (port 0 is allowed when the
server is created up front, see :class:`RendezvousServer`), collects
``world_size`` registrations and answers each with the full table. It keeps
answering until the world shuts down, so a process that comes late (or twice)
is told why it cannot join instead of waiting out its timeout.

With ``file:///path`` (PyTorch's file init, for processes that share a file
system) rank 0 binds a free port and writes its address into the file, where the others
find it (``rendezvous_file.py``).

Every registration gets an answer: a malformed one, another world size, a rank
out of range, a name or rank already taken (both claimants are told, and the
rendezvous is abandoned: the world would be ambiguous), a complete world.

A registration also carries what checks its sender's credential (``auth``: mechanism
and verifier, see ``credentials.py``), which the table hands to every member. With a
world secret, a registration proves it holds the secret (``proof``: an HMAC over its
content) and the answer proves the same over the table; one without the proof, or with
a wrong one, is refused with a message naming it, and the secret never crosses the wire.
"""
import collections
import logging
import os
import threading
import time

import msgpack
import zmq

from ..utils import addresses
from ..utils.lifetimes import join_all
from .credentials import MECHANISMS, SECRET_ENV, prove, proven
from .errors import RpcError, RpcTimeoutError

__all__ = ["RendezvousServer", "MeetingPoint", "join", "resolve_address", "RendezvousError"]

log = logging.getLogger("distgrad.rpc")


class RendezvousError(RpcError):
    """The world could not form: a clash, a mismatch, or it is complete already."""


def resolve_address(init_method):
    if init_method and init_method != "env://":
        if not init_method.startswith(("tcp://", "ipc://")):
            raise ValueError(f"init_method must be env://, tcp://host:port, ipc://path or "
                             f"file:///path, not {init_method!r}")
        return init_method
    coord = os.environ.get("DISTGRAD_COORDINATOR")
    if coord:
        return coord
    addr, port = os.environ.get("MASTER_ADDR"), os.environ.get("MASTER_PORT")
    if not addr or not port:
        raise ValueError("rendezvous address unknown: set MASTER_ADDR and MASTER_PORT, "
                         "DISTGRAD_COORDINATOR, or pass init_method='tcp://host:port'")
    try:
        port = int(port)
    except ValueError:
        raise ValueError(f"MASTER_PORT must be a port number, not {port!r}") from None
    if not 0 < port < 65536:
        raise ValueError(f"MASTER_PORT {port} is out of range 1-65535")
    return addresses.endpoint(addr, port)


def _secure(sock, curve, server):
    if curve is None:
        return
    public, secret = curve
    if server:
        sock.curve_server = True
        sock.curve_secretkey = secret
        sock.curve_publickey = public
    else:
        sock.curve_serverkey = public
        sock.curve_publickey = public
        sock.curve_secretkey = secret


_NO_AUTH = ["none", None]


def _registration(frame):
    """(name, rank, world_size, endpoint, auth, proof) of a registration, or a text saying
    what is wrong."""
    if len(frame) > _MAX_REGISTRATION:
        return f"a registration is at most {_MAX_REGISTRATION} bytes"
    try:
        reg = msgpack.unpackb(frame, raw=False)
    except Exception:  # noqa: BLE001 - garbage on the port
        return "a registration must be a msgpack map"
    if type(reg) is not dict:
        return "a registration must be a msgpack map"
    name, rank, ws, ep = (reg.get(k) for k in ("name", "rank", "world_size", "endpoint"))
    if type(name) is not str or not name or len(name) > 256:
        return "'name' must be a non-empty string"
    if type(rank) is not int or type(ws) is not int or ws < 1:
        return "'rank' and 'world_size' must be integers (world_size >= 1)"
    if type(ep) is not str or not ep.startswith(("tcp://", "ipc://")) or len(ep) > 1024:
        return "'endpoint' must be a tcp:// or ipc:// address"
    auth = reg.get("auth", _NO_AUTH)
    if type(auth) is not list or len(auth) != 2 or auth[0] not in MECHANISMS \
            or not (auth[1] is None if auth[0] == "none" else type(auth[1]) is str
                    and 0 < len(auth[1]) <= 256):
        return f"'auth' must be [mechanism, verifier] with a mechanism of {list(MECHANISMS)}"
    return name, rank, ws, ep, auth, reg.get("proof")


def _registered(name, rank, world_size, endpoint, auth):
    """What a registration's proof covers."""
    return [name, rank, world_size, endpoint, auth]


# ---------------------------------------------------------------------- meeting points
_MAX_REGISTRATION = 65536  # bytes: a registration is a few hundred
_POLL_SLICE = 0.05         # s: how soon the serving thread notices a stop or a new handler


def _normalized(address):
    """``tcp://host:port`` with the host resolved (``localhost`` and ``127.0.0.1`` are one
    place) to the address a server there binds (``addresses.listen_address``); other
    addresses as they are."""
    if not address.startswith("tcp://"):
        return address
    host, _, port = address[len("tcp://"):].rpartition(":")
    try:
        host = addresses.listen_address(host)
    except addresses.AddressError as e:
        raise RendezvousError(f"cannot serve the rendezvous at {address}: {e}") from None
    return addresses.endpoint(host, port)


_MAX_PARKED = 1024  # frames per kind kept for a handler not attached yet


def _kind_of(frame):
    """``"map"`` for what looks like a registration (a msgpack map with a name),
    ``"array"`` for what looks like a store request (``[id, op, args]``), None for
    anything else."""
    if not frame or not (0x80 <= frame[0] <= 0x8F or frame[0] in (0xDE, 0xDF)
                         or 0x90 <= frame[0] <= 0x9F or frame[0] in (0xDC, 0xDD)):
        return None
    try:
        obj = msgpack.unpackb(frame, raw=False, max_str_len=1 << 16, max_bin_len=1 << 30,
                              max_array_len=100_000, max_map_len=64)
    except Exception:  # noqa: BLE001 - garbage
        return None
    if type(obj) is dict and "name" in obj:
        return "map"
    if type(obj) is list and len(obj) == 3 and type(obj[0]) is int and type(obj[1]) is str:
        return "array"
    return None


class MeetingPoint:
    """One ROUTER socket at one address of this process, served by one thread, shared by
    what meets there: the RPC rendezvous (registrations, msgpack maps) and a process
    group's ``TCPStore`` (requests, msgpack arrays). As PyTorch's multi-tenant
    ``TCPStore``, it lets ``init_process_group`` and ``init_rpc`` use the same
    ``MASTER_ADDR``/``MASTER_PORT``, in either order.

    A handler has ``accepts`` (``"map"`` or ``"array"``), ``on_frame(point, ident,
    frame)``, ``tick(point, now)`` and ``next_deadline()``; all three run on the serving
    thread, which alone touches the socket (``send`` is for them). A registration or a
    store request that comes before its handler does (a rank that reaches
    ``init_process_group`` before rank 0, whose rendezvous is up already) waits for it,
    a bounded number of them; anything else goes to whichever handler there is, which
    answers that it is malformed.
    """

    _registry = {}   # address -> MeetingPoint
    _registry_lock = threading.Lock()

    @classmethod
    def acquire(cls, address, curve=None, max_message=_MAX_REGISTRATION, bind_error=None):
        """The point serving ``address`` in this process, made (bound) if there is none.
        ``bind_error(address, zmq_error)`` makes the exception a failed bind raises."""
        address = _normalized(address)
        with cls._registry_lock:
            point = None if address.endswith(":0") else cls._registry.get(address)
            if point is not None:
                if point.curve != curve:
                    raise RendezvousError(
                        f"{address} is already served in this process with "
                        f"{'no ' if point.curve is None else ''}CURVE keys; init_rpc and "
                        "init_process_group share it only with the same security")
                point.users += 1
                point.max_message = max(point.max_message, max_message)
                return point
            point = cls(address, curve, max_message, bind_error)
            cls._registry[point.address] = point
            return point

    def __init__(self, address, curve, max_message, bind_error):
        self.curve, self.max_message, self.users = curve, max_message, 1
        # a context of its own, ended with the point: nothing of it outlives its users
        self._ctx = zmq.Context(io_threads=1)
        self._sock = self._ctx.socket(zmq.ROUTER)
        self._sock.ipv6 = addresses.is_ipv6(address)
        self._sock.linger = 0
        self._sock.router_mandatory = 1
        self._sock.maxmsgsize = self._applied_limit = max_message
        _secure(self._sock, curve, server=True)
        try:
            self._sock.bind(address)
        except zmq.ZMQError as e:
            self._sock.close(linger=0)
            self._ctx.term()
            if bind_error is not None:
                raise bind_error(address, e) from None
            raise
        self.address = self._sock.last_endpoint.decode()
        self._handlers = ()
        self._parked = {"map": collections.deque(maxlen=_MAX_PARKED),
                        "array": collections.deque(maxlen=_MAX_PARKED)}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True,
                                        name=f"meeting-point-{self.address.rsplit('/', 1)[-1]}")
        self._thread.start()

    def attach(self, handler):
        with self._lock:
            if any(h.accepts == handler.accepts for h in self._handlers):
                what = "an RPC rendezvous" if handler.accepts == "map" else "a store"
                raise RendezvousError(f"{self.address} already serves {what} in this process")
            self._handlers = self._handlers + (handler,)

    def detach(self, handler):
        with self._lock:
            self._handlers = tuple(h for h in self._handlers if h is not handler)

    def release(self, timeout=5.0):
        """One user less; the last one stops the thread (joined up to ``timeout`` s), which
        closes the socket."""
        with MeetingPoint._registry_lock:
            self.users -= 1
            if self.users > 0:
                return
            if MeetingPoint._registry.get(self.address) is self:
                del MeetingPoint._registry[self.address]
        self._stop.set()
        if timeout > 0:  # 0: the caller knows it ends within its poll slice (_POLL_SLICE)
            join_all([self._thread], timeout, f"meeting point {self.address}")

    def send(self, ident, payload):
        """Reply to ``ident`` (serving thread only); a peer that left is not an error."""
        try:
            self._sock.send_multipart([ident, payload], zmq.NOBLOCK)
        except zmq.ZMQError:
            pass

    def _serve(self):
        sock = self._sock
        try:
            while not self._stop.is_set():
                handlers = self._handlers
                if self.max_message != self._applied_limit:  # a store joined: larger values
                    sock.maxmsgsize = self._applied_limit = self.max_message
                now = time.monotonic()
                deadline = min([h.next_deadline() for h in handlers] + [now + _POLL_SLICE])
                if sock.poll(max(0, int((deadline - now) * 1000)) + 1):
                    for _ in range(256):
                        try:
                            frames = sock.recv_multipart(zmq.NOBLOCK)
                        except zmq.Again:
                            break
                        if len(frames) == 2:
                            self._dispatch(self._handlers, frames[0], frames[1])
                now = time.monotonic()
                for h in handlers:
                    parked = self._parked[h.accepts]
                    while parked:  # what came for it before it was attached
                        h.on_frame(self, *parked.popleft())
                    h.tick(self, now)
        except Exception as e:  # noqa: BLE001 - peers then time out; say why here
            log.error("the rendezvous at %s stopped: %s", self.address, e)
            for h in self._handlers:
                h.failed(self, f"rendezvous server failed: {e}")
        finally:
            sock.close(linger=500)  # answers still queued get half a second to leave
            self._ctx.term()

    def _dispatch(self, handlers, ident, frame):
        kind = _kind_of(frame)
        for h in handlers:
            if h.accepts == kind or (kind is None and h is handlers[0]):
                h.on_frame(self, ident, frame)
                return
        if kind is not None:
            self._parked[kind].append((ident, frame))


class _Registrations:
    """The rendezvous as a meeting point's handler: collects ``world_size``
    registrations, answers each with the table, and keeps answering late or clashing
    ones with why they cannot join. With ``secret``, only registrations that prove they
    hold it count."""

    accepts = "map"

    def __init__(self, secret=None):
        self.secret = secret
        self.world_size = self.deadline = self.timeout = None
        self.table = self.error = None
        self._early = []          # registrations that came before start()
        self._seen, self._idents = {}, {}   # rank -> (name, endpoint), rank -> identity

    def start(self, world_size, timeout):
        self.timeout = timeout
        self.deadline = time.monotonic() + timeout
        self.world_size = world_size   # last: the serving thread reads it to begin

    def next_deadline(self):
        return self.deadline if self.forming() else float("inf")

    def forming(self):
        return self.world_size is not None and self.table is None and self.error is None

    def tick(self, point, now):
        if self.world_size is None:
            return
        early, self._early = self._early, []
        for ident, frame in early:
            self.on_frame(point, ident, frame)
        if self.forming() and now > self.deadline:
            missing = [r for r in range(self.world_size) if r not in self._seen]
            self.failed(point, f"rendezvous timed out after {self.timeout:g} s with "
                               f"{len(self._seen)} of {self.world_size} processes (missing "
                               f"ranks {missing[:16]})")

    def failed(self, point, error):
        self.error = error
        self._reply_all(point, {"ok": False, "error": error})

    def _reply_all(self, point, msg):
        for ident in self._idents.values():
            point.send(ident, msgpack.packb(msg))
        self._idents.clear()

    def on_frame(self, point, ident, frame):
        if self.world_size is None:
            self._early.append((ident, frame))
            return
        reg = _registration(frame)
        send = lambda msg: point.send(ident, msgpack.packb(msg))  # noqa: E731
        if isinstance(reg, str):
            send({"ok": False, "error": f"malformed registration: {reg}"})
            return
        name, rank, ws, ep, auth, proof = reg
        world_size, seen = self.world_size, self._seen
        refusal = self._unproven(name, rank, ws, ep, auth, proof)
        if refusal is not None:
            log.warning("rendezvous: refused %r (rank %r): %s", name, rank, refusal)
            send({"ok": False, "error": refusal})
        elif self.table is not None:
            send({"ok": False, "error": f"the world of {world_size} processes is already "
                                        f"complete; {name!r} (rank {rank}) cannot join it"})
        elif self.error is not None:
            send({"ok": False, "error": self.error})
        elif ws != world_size:
            send({"ok": False, "error": f"world_size {ws} of {name!r} differs from the "
                                        f"coordinator's {world_size}"})
        elif not 0 <= rank < world_size:
            send({"ok": False, "error": f"rank {rank} of {name!r} is out of range for "
                                        f"world_size {world_size}"})
        elif rank in seen or any(s[0] == name for s in seen.values()):
            other = seen.get(rank, (None,))[0]
            clash = (f"rank {rank} is claimed by both {other!r} and {name!r}"
                     if rank in seen else f"worker name {name!r} is used twice")
            send({"ok": False, "error": clash})
            self.failed(point, f"rendezvous abandoned: {clash}")
        elif seen and auth[0] != next(iter(seen.values()))[2][0]:
            mechanism = next(iter(seen.values()))[2][0]
            send({"ok": False, "error": f"{name!r} (rank {rank}) authenticates with {auth[0]!r}"
                                        f", the others with {mechanism!r}: every process of "
                                        "a world must use the same RpcBackendOptions "
                                        "(authenticate, CURVE keys)"})
        else:
            seen[rank] = (name, ep, auth)
            self._idents[rank] = ident
            if len(seen) == world_size:
                self.table = [[seen[r][0], r, seen[r][1], seen[r][2]] for r in range(world_size)]
                answer = {"ok": True, "workers": self.table}
                if self.secret is not None:
                    answer["proof"] = prove(self.secret, "table", self.table)
                self._reply_all(point, answer)

    def _unproven(self, name, rank, ws, ep, auth, proof):
        """Why a registration does not prove it holds the world's secret (None: it does)."""
        who = f"{name!r} (rank {rank})"
        if self.secret is None:
            if proof is None:
                return None
            return (f"{who} holds a world secret but the rendezvous has none: give every "
                    f"process of the world the same {SECRET_ENV}")
        if proof is None:
            return (f"{who} has no world secret: this world requires one (set {SECRET_ENV} "
                    "as for the other processes)")
        if not proven(self.secret, "registration", _registered(name, rank, ws, ep, auth), proof):
            return (f"{who} has a wrong world secret: its {SECRET_ENV} differs from the "
                    "rendezvous's")
        return None


def _rendezvous_bind_error(address, e):
    hint = (" (another process is using it: choose another MASTER_PORT, or let rank 0 pick a "
            "free port)" if e.errno == zmq.EADDRINUSE else "")
    return RendezvousError(f"cannot bind the rendezvous at {address}: {e}{hint}")


class RendezvousServer:
    """The rank-0 side; bind first (port 0 is fine), read ``address``, then ``start``.

    It serves at a :class:`MeetingPoint`: where a process group of this process already
    serves its store at that address (same ``MASTER_ADDR``/``MASTER_PORT``), the two share
    it. ``ctx`` is accepted for the callers' sake; the point has its own socket.
    """

    def __init__(self, ctx, address, curve=None, secret=None):
        self._point = MeetingPoint.acquire(address, curve, bind_error=_rendezvous_bind_error)
        self._registrations = _Registrations(secret)
        try:
            self._point.attach(self._registrations)
        except BaseException:
            self._point.release()
            raise
        self.address = self._point.address
        self._stopped = False

    @property
    def started(self):
        return self._registrations.world_size is not None

    @property
    def world_size(self):
        return self._registrations.world_size

    @property
    def table(self):
        return self._registrations.table

    @property
    def error(self):
        return self._registrations.error

    def start(self, world_size, timeout):
        self._registrations.start(world_size, timeout)

    def wait_formed(self, timeout):
        """Wait until the world formed or failed (for the owner of the server)."""
        end = time.monotonic() + timeout
        while self.table is None and self.error is None and time.monotonic() < end:
            time.sleep(0.01)

    def stop(self, timeout=5.0):
        """Stop answering registrations; the point closes with its last user."""
        if self._stopped:
            return
        self._stopped = True
        self._point.detach(self._registrations)
        self._point.release(timeout)


def join(ctx, address, name, rank, world_size, endpoint, timeout, curve=None, auth=None,
         secret=None):
    """Register with the rendezvous at ``address``; return [[name, rank, endpoint, auth],
    ...]. ``auth`` is this process's [mechanism, verifier]; with ``secret`` the
    registration proves it holds the world's secret, and so must the answer."""
    auth = list(auth) if auth is not None else _NO_AUTH
    registration = {"name": name, "rank": rank, "world_size": world_size,
                    "endpoint": endpoint, "auth": auth}
    if secret is not None:
        registration["proof"] = prove(secret, "registration",
                                      _registered(name, rank, world_size, endpoint, auth))
    sock = ctx.socket(zmq.DEALER)
    sock.linger = 0
    sock.ipv6 = addresses.is_ipv6(address)
    _secure(sock, curve, server=False)
    try:
        sock.connect(address)
        sock.send(msgpack.packb(registration))
        if not sock.poll(int(timeout * 1000)):
            why = addresses.diagnose(address) if address.startswith("tcp://") else None
            raise RpcTimeoutError(f"rendezvous at {address} did not answer {name!r} "
                                  f"(rank {rank}) within {timeout:g} s"
                                  + (f" ({why})" if why else "") + ": is rank 0 running, and "
                                  "are MASTER_ADDR/MASTER_PORT (or init_method) the same "
                                  "everywhere? (rendezvous_timeout, --rendezvous-timeout)")
        try:
            reply = msgpack.unpackb(sock.recv(), raw=False)
        except Exception:  # noqa: BLE001
            raise RendezvousError(f"the rendezvous at {address} answered {name!r} with "
                                  "garbage") from None
    finally:
        sock.close(linger=0)
    if type(reply) is not dict or not reply.get("ok"):
        err = reply.get("error") if type(reply) is dict else reply
        raise RendezvousError(f"rendezvous failed for {name!r} (rank {rank}): {err}")
    table = reply["workers"]
    if secret is not None and not proven(secret, "table", table, reply.get("proof")):
        raise RendezvousError(f"the rendezvous at {address} answered {name!r} (rank {rank}) "
                              "without proof that it holds the world secret: another "
                              f"process answers there, or rank 0 has another {SECRET_ENV}")
    return table

"""Rendezvous: every process registers (name, rank, endpoint); rank 0 serves the table.

The rendezvous address comes from ``init_method`` (``tcp://host:port`` or
``ipc:///path``) or, for ``env://``, from ``DISTGRAD_COORDINATOR`` or
``MASTER_ADDR``/``MASTER_PORT``. Rank 0 binds it (port 0 is allowed when the
server is created up front, see :class:`RendezvousServer`), collects
``world_size`` registrations and answers each with the full table. It keeps
answering until the world shuts down, so a process that comes late (or twice)
is told why it cannot join instead of waiting out its timeout.

With ``file:///path`` (PyTorch's file init, for processes that share a file
system) rank 0 binds a free port and writes its address into the file
(:func:`publish`); the others wait for it there (:func:`read_published`); rank 0
removes the file when it shuts down. As with PyTorch's, each run needs a file no
earlier run left behind.

Every registration gets an answer: a malformed one, another world size, a rank
out of range, a name or rank already taken (both claimants are told, and the
rendezvous is abandoned: the world would be ambiguous), a complete world.
"""
import logging
import os
import threading
import time
import urllib.parse

import msgpack
import zmq

from .errors import RpcError, RpcTimeoutError

__all__ = ["RendezvousServer", "join", "resolve_address", "RendezvousError", "file_path",
           "publish", "read_published", "unpublish"]

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
    return f"tcp://{addr}:{port}"


def file_path(init_method):
    """The file of a ``file://`` init method; None for the other kinds."""
    if not (init_method or "").startswith("file://"):
        return None
    url = urllib.parse.urlparse(init_method)
    path = url.netloc + url.path
    if not path:
        raise ValueError(f"init_method {init_method!r} names no file: use file:///path")
    return path


def publish(path, address):
    """Rank 0: write ``address`` into ``path``, whole or not at all (a reader polls it)."""
    tmp = f"{path}.{os.getpid()}.tmp"
    try:
        with open(tmp, "w") as f:
            f.write(address)
        os.replace(tmp, path)
    except OSError as e:
        raise RendezvousError(f"cannot write the rendezvous address into {path!r}: {e}") from None


def read_published(path, timeout):
    """The address rank 0 wrote into ``path``, waiting up to ``timeout`` s for it."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            with open(path) as f:
                address = f.read().strip()
            if address:
                return address
        except FileNotFoundError:
            pass
        except OSError as e:
            raise RendezvousError(f"cannot read the rendezvous file {path!r}: {e}") from None
        if time.monotonic() >= deadline:
            raise RpcTimeoutError(f"no rendezvous address appeared in {path!r} within "
                                  f"{timeout:g} s: is rank 0 running with the same "
                                  "init_method? (rendezvous_timeout, --rendezvous-timeout)")
        time.sleep(0.02)


def unpublish(path, address):
    """Rank 0 at shutdown: remove ``path`` if it still holds ``address``."""
    try:
        with open(path) as f:
            if f.read().strip() == address:
                os.unlink(path)
    except OSError:
        pass


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


def _registration(frame):
    """(name, rank, world_size, endpoint) of a registration, or a text saying what is wrong."""
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
    return name, rank, ws, ep


class RendezvousServer:
    """The rank-0 side; bind first (port 0 is fine), read ``address``, then ``start``."""

    def __init__(self, ctx, address, curve=None):
        self._sock = ctx.socket(zmq.ROUTER)
        self._sock.linger = 0
        self._sock.router_mandatory = 1
        self._sock.maxmsgsize = 65536  # a registration is a few hundred bytes
        _secure(self._sock, curve, server=True)
        try:
            self._sock.bind(address)
        except zmq.ZMQError as e:
            self._sock.close(linger=0)
            hint = (" (another process is using it: choose another MASTER_PORT, or let rank 0 "
                    "pick a free port)" if e.errno == zmq.EADDRINUSE else "")
            raise RendezvousError(f"cannot bind the rendezvous at {address}: {e}{hint}") from None
        self.address = self._sock.last_endpoint.decode()
        self._thread = None
        self._stop = threading.Event()
        self.world_size = None
        self.table = None
        self.error = None

    @property
    def started(self):
        return self._thread is not None

    def start(self, world_size, timeout):
        self.world_size = world_size
        self._thread = threading.Thread(target=self._serve, args=(world_size, timeout),
                                        name="rpc-rendezvous", daemon=True)
        self._thread.start()

    def _serve(self, world_size, timeout):
        sock, deadline = self._sock, time.monotonic() + timeout
        seen, idents = {}, {}   # rank -> (name, endpoint), rank -> socket identity
        try:
            while not self._stop.is_set():
                forming = self.table is None and self.error is None
                if forming and time.monotonic() > deadline:
                    missing = [r for r in range(world_size) if r not in seen]
                    self._fail(idents, f"rendezvous timed out after {timeout:g} s with "
                                       f"{len(seen)} of {world_size} processes (missing ranks "
                                       f"{missing[:16]})")
                    continue
                if not sock.poll(50):  # stop() waits at most this long
                    continue
                frames = sock.recv_multipart()
                if len(frames) != 2:
                    continue
                ident, reg = frames[0], _registration(frames[1])
                if isinstance(reg, str):
                    self._send(ident, {"ok": False, "error": f"malformed registration: {reg}"})
                    continue
                name, rank, ws, ep = reg
                if self.table is not None:
                    self._send(ident, {"ok": False, "error": f"the world of {world_size} "
                                       f"processes is already complete; {name!r} (rank {rank}) "
                                       "cannot join it"})
                elif self.error is not None:
                    self._send(ident, {"ok": False, "error": self.error})
                elif ws != world_size:
                    self._send(ident, {"ok": False, "error": f"world_size {ws} of {name!r} "
                                       f"differs from the coordinator's {world_size}"})
                elif not 0 <= rank < world_size:
                    self._send(ident, {"ok": False, "error": f"rank {rank} of {name!r} is out "
                                       f"of range for world_size {world_size}"})
                elif rank in seen or any(n == name for n, _ in seen.values()):
                    other = seen.get(rank, (None,))[0]
                    clash = (f"rank {rank} is claimed by both {other!r} and {name!r}"
                             if rank in seen else f"worker name {name!r} is used twice")
                    self._send(ident, {"ok": False, "error": clash})
                    self._fail(idents, f"rendezvous abandoned: {clash}")
                else:
                    seen[rank] = (name, ep)
                    idents[rank] = ident
                    if len(seen) == world_size:
                        self.table = [[seen[r][0], r, seen[r][1]] for r in range(world_size)]
                        self._reply_all(idents, {"ok": True, "workers": self.table})
        except Exception as e:  # noqa: BLE001 - report it to whoever waits, never die silently
            log.error("rendezvous server failed: %s", e)
            self._fail(idents, f"rendezvous server failed: {e}")
        finally:
            self._sock.close(linger=500)

    def _fail(self, idents, error):
        self.error = error
        self._reply_all(idents, {"ok": False, "error": error})
        idents.clear()

    def _send(self, ident, msg):
        try:
            self._sock.send_multipart([ident, msgpack.packb(msg)], zmq.NOBLOCK)
        except zmq.ZMQError:
            pass

    def _reply_all(self, idents, msg):
        for ident in idents.values():
            self._send(ident, msg)

    def wait_formed(self, timeout):
        """Wait until the world formed or failed (for the owner of the server)."""
        end = time.monotonic() + timeout
        while self.table is None and self.error is None and time.monotonic() < end:
            time.sleep(0.01)

    def stop(self, timeout=5.0):
        """Stop answering and close the socket (the thread owns it)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
        else:
            self._sock.close(linger=0)


def join(ctx, address, name, rank, world_size, endpoint, timeout, curve=None):
    """Register with the rendezvous at ``address``; return [[name, rank, endpoint], ...]."""
    sock = ctx.socket(zmq.DEALER)
    sock.linger = 0
    _secure(sock, curve, server=False)
    try:
        sock.connect(address)
        sock.send(msgpack.packb({"name": name, "rank": rank, "world_size": world_size,
                                 "endpoint": endpoint}))
        if not sock.poll(int(timeout * 1000)):
            raise RpcTimeoutError(f"rendezvous at {address} did not answer {name!r} "
                                  f"(rank {rank}) within {timeout:g} s: is rank 0 running, and "
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
    return reply["workers"]

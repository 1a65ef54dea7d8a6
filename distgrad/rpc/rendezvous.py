"""Rendezvous: every process registers (name, rank, endpoint); rank 0 serves the table.

The rendezvous address comes from ``init_method`` (``tcp://host:port`` or
``ipc:///path``) or, for ``env://``, from ``DISTGRAD_COORDINATOR`` or
``MASTER_ADDR``/``MASTER_PORT``. Rank 0 binds it (port 0 is allowed when the
server is created up front, see :class:`RendezvousServer`), collects
``world_size`` registrations and answers each with the full table.
"""
import os
import threading
import time

import msgpack
import zmq

from .errors import RpcError, RpcTimeoutError

__all__ = ["RendezvousServer", "join", "resolve_address"]


def resolve_address(init_method):
    if init_method and init_method != "env://":
        if not init_method.startswith(("tcp://", "ipc://")):
            raise ValueError(f"init_method must be env://, tcp://host:port or ipc://path, "
                             f"not {init_method!r}")
        return init_method
    coord = os.environ.get("DISTGRAD_COORDINATOR")
    if coord:
        return coord
    addr, port = os.environ.get("MASTER_ADDR"), os.environ.get("MASTER_PORT")
    if not addr or not port:
        raise ValueError("rendezvous address unknown: set MASTER_ADDR and MASTER_PORT, "
                         "DISTGRAD_COORDINATOR, or pass init_method='tcp://host:port'")
    return f"tcp://{addr}:{int(port)}"


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


class RendezvousServer:
    """The rank-0 side; bind first (port 0 is fine), read ``address``, then ``start``."""

    def __init__(self, ctx, address, curve=None):
        self._sock = ctx.socket(zmq.ROUTER)
        self._sock.linger = 0
        self._sock.router_mandatory = 1
        _secure(self._sock, curve, server=True)
        self._sock.bind(address)
        self.address = self._sock.last_endpoint.decode()
        self._thread = None
        self.error = None

    def start(self, world_size, timeout):
        self._thread = threading.Thread(target=self._serve, args=(world_size, timeout),
                                        name="rpc-rendezvous", daemon=True)
        self._thread.start()

    def _serve(self, world_size, timeout):
        sock, deadline = self._sock, time.monotonic() + timeout
        seen, idents = {}, {}
        try:
            while len(seen) < world_size:
                left = deadline - time.monotonic()
                if left <= 0 or not sock.poll(int(left * 1000)):
                    self._reply_all(idents, {"ok": False, "error": "rendezvous timed out with "
                                             f"{len(seen)} of {world_size} processes"})
                    return
                frames = sock.recv_multipart()
                if len(frames) != 2:
                    continue
                ident, err = frames[0], None
                try:
                    reg = msgpack.unpackb(frames[1], raw=False)
                    name, rank, ws, ep = reg["name"], reg["rank"], reg["world_size"], reg["endpoint"]
                except Exception:
                    continue  # garbage on the rendezvous port: ignore
                if ws != world_size:
                    err = f"world_size {ws} of {name!r} differs from the coordinator's {world_size}"
                elif not (isinstance(rank, int) and 0 <= rank < world_size):
                    err = f"rank {rank!r} of {name!r} is out of range for world_size {world_size}"
                elif rank in seen and seen[rank][0] != name:
                    err = f"rank {rank} claimed by both {seen[rank][0]!r} and {name!r}"
                elif any(n == name and r != rank for r, (n, _) in seen.items()):
                    err = f"worker name {name!r} is used twice"
                if err:
                    self._send(ident, {"ok": False, "error": err})
                    continue
                seen[rank] = (name, ep)
                idents[rank] = ident
            table = [[seen[r][0], r, seen[r][1]] for r in range(world_size)]
            self._reply_all(idents, {"ok": True, "workers": table})
        finally:
            self._sock.close(linger=1000)

    def _send(self, ident, msg):
        try:
            self._sock.send_multipart([ident, msgpack.packb(msg)])
        except zmq.ZMQError:
            pass

    def _reply_all(self, idents, msg):
        for ident in idents.values():
            self._send(ident, msg)

    def join_thread(self, timeout):
        if self._thread is not None:
            self._thread.join(timeout)


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
                                  f"(rank {rank}) within {timeout} s")
        reply = msgpack.unpackb(sock.recv(), raw=False)
    finally:
        sock.close(linger=0)
    if not reply.get("ok"):
        raise RpcError(f"rendezvous failed for {name!r} (rank {rank}): {reply.get('error')}")
    return reply["workers"]

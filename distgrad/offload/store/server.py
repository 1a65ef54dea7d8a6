"""The activation store server: one ROUTER socket, one thread, blobs in a BlobStore.

Liveness is libzmq's, not Python's: the ROUTER runs ZMTP heartbeats on every
connection in libzmq's I/O thread, so a client busy in NumPy for minutes is
alive, while a client that died or was stopped is disconnected within
``heartbeat_timeout``. The socket monitor reports the disconnect with the
connection's file descriptor, and every message carries the descriptor it came
from (``SRCFD``), so the store knows whose connection ended and frees that
client's blobs. Monitor events are drained before messages are read: a
descriptor reused by a new connection is first reported closed.
"""
import logging
import os
import socket
import threading

import zmq

from ...utils import addresses
from ...utils.lifetimes import join_all
from ...utils.socket_monitor import recv_monitor_event
from ..errors import StoreError
from . import protocol
from .blobs import BlobStore

__all__ = ["StoreServer", "DEFAULT_HEARTBEAT_INTERVAL", "DEFAULT_HEARTBEAT_TIMEOUT"]

log = logging.getLogger("distgrad.offload.store")

DEFAULT_HEARTBEAT_INTERVAL = 0.5
DEFAULT_HEARTBEAT_TIMEOUT = 3.0


def set_heartbeats(sock, interval, timeout):
    """ZMTP heartbeats on ``sock`` (seconds): libzmq pings and drops a silent peer."""
    sock.setsockopt(zmq.HEARTBEAT_IVL, max(1, int(interval * 1000)))
    sock.setsockopt(zmq.HEARTBEAT_TIMEOUT, max(1, int(timeout * 1000)))
    sock.setsockopt(zmq.HEARTBEAT_TTL, max(100, int(timeout * 1000)))


class StoreServer:
    """Serve a :class:`BlobStore` on ``endpoint`` (``tcp://127.0.0.1:0`` picks a free port;
    ``endpoint`` is then the real address).

    >>> server = StoreServer(memory_bytes=1 << 20).start()
    >>> server.endpoint.startswith("tcp://127.0.0.1:")
    True
    >>> server.close()
    """

    def __init__(self, endpoint="tcp://127.0.0.1:0", *, memory_bytes=1 << 30,
                 spill_directory=None, spill_bytes=None,
                 heartbeat_interval=DEFAULT_HEARTBEAT_INTERVAL,
                 heartbeat_timeout=DEFAULT_HEARTBEAT_TIMEOUT, max_message_bytes=4 << 30):
        if heartbeat_timeout <= heartbeat_interval:
            raise ValueError("heartbeat_timeout must exceed heartbeat_interval")
        self._ctx = zmq.Context(io_threads=1)
        sock = self._ctx.socket(zmq.ROUTER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.ROUTER_MANDATORY, 1)
        sock.setsockopt(zmq.MAXMSGSIZE, int(max_message_bytes))
        set_heartbeats(sock, heartbeat_interval, heartbeat_timeout)
        self._monitor = sock.get_monitor_socket(zmq.EVENT_ACCEPTED | zmq.EVENT_DISCONNECTED)
        sock.ipv6 = addresses.is_ipv6(endpoint)
        if endpoint.startswith("tcp://") and endpoint.endswith(":0"):
            port = sock.bind_to_random_port(endpoint[:-2])
            endpoint = f"{endpoint[:-2]}:{port}"
        else:
            sock.bind(endpoint)
            endpoint = sock.getsockopt_string(zmq.LAST_ENDPOINT)
        if endpoint.startswith("tcp://"):
            host, port = addresses.host_port(endpoint)
            if addresses.is_wildcard(host):  # every interface: clients elsewhere need one
                family = socket.AF_INET6 if ":" in host else socket.AF_INET
                endpoint = addresses.endpoint(addresses.host_address(family), port)
        self.endpoint = endpoint
        self._sock = sock
        self.blobs = BlobStore(memory_bytes, spill_directory, spill_bytes, name=endpoint)
        self._client_of_fd = {}   # fd -> routing id of the connection using it
        self._fd_of_client = {}
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_w, False)
        self._stopping = False
        self._thread = None

    # ------------------------------------------------------------ running
    def start(self):
        """Serve in a background thread (tests, or a store inside another process)."""
        self._thread = threading.Thread(target=self.serve_forever, name="distgrad-store",
                                        daemon=True)
        self._thread.start()
        return self

    def serve_forever(self):
        """Serve until :meth:`stop` (from any thread or a signal handler)."""
        poller = zmq.Poller()
        poller.register(self._sock, zmq.POLLIN)
        poller.register(self._monitor, zmq.POLLIN)
        poller.register(self._wake_r, zmq.POLLIN)
        try:
            while not self._stopping:
                ready = dict(poller.poll(1000))
                self._drain_monitor()
                if self._sock in ready:
                    for _ in range(256):   # then look at the monitor again
                        try:
                            frames = self._sock.recv_multipart(zmq.NOBLOCK, copy=False)
                        except zmq.Again:
                            break
                        self._handle(frames)
                        self._drain_monitor()
                if self._wake_r in ready:
                    os.read(self._wake_r, 4096)
        finally:
            self._shutdown()

    def stop(self):
        self._stopping = True
        try:
            os.write(self._wake_w, b"x")
        except (BlockingIOError, OSError):
            pass

    def close(self):
        self.stop()
        if self._thread is not None:
            join_all([self._thread], 10.0, "activation store")
            self._thread = None

    def _shutdown(self):
        self.blobs.close()
        self._monitor.close(0)
        self._sock.close(0)
        self._ctx.term()
        for fd in (self._wake_r, self._wake_w):
            try:
                os.close(fd)
            except OSError:
                pass

    # ------------------------------------------------------------ clients
    def _drain_monitor(self):
        while True:
            try:
                event, fd = recv_monitor_event(self._monitor, zmq.NOBLOCK)
            except zmq.Again:
                return
            if event == zmq.EVENT_DISCONNECTED:
                client = self._client_of_fd.pop(fd, None)
                if client is not None:
                    self._fd_of_client.pop(client, None)
                    freed = self.blobs.drop_client(client)
                    log.info("client %s disconnected; freed %d blobs", client.hex(), freed)
            elif event == zmq.EVENT_ACCEPTED:
                old = self._client_of_fd.pop(fd, None)
                if old is not None:  # the fd's old connection ended unseen: it is gone
                    self._fd_of_client.pop(old, None)
                    self.blobs.drop_client(old)

    def _note_connection(self, client, frame):
        if client in self._fd_of_client:
            return
        try:
            fd = frame.get(zmq.SRCFD)
        except (zmq.ZMQError, AttributeError):
            return
        self._fd_of_client[client] = fd
        self._client_of_fd[fd] = client

    # ------------------------------------------------------------ requests
    def _handle(self, frames):
        if len(frames) < 2:
            return
        client = frames[0].bytes
        self._note_connection(client, frames[1])
        try:
            msg = protocol.decode_request(frames[1:])
        except protocol.ProtocolError as e:
            log.warning("client %s: %s", client.hex(), e)
            return
        op, rid = msg["op"], msg.get("id")
        try:
            reply = self._serve(client, op, msg)
        except StoreError as e:
            reply = {"error": str(e)}
        except Exception as e:  # noqa: BLE001 - the store keeps serving the others
            log.exception("%s request failed", op)
            reply = {"error": f"{type(e).__name__}: {e}"}
        if reply is None or rid is None:
            return
        reply["id"] = rid
        try:
            self._sock.send_multipart([client, *protocol.encode(reply)], copy=False)
        except zmq.ZMQError as e:  # EHOSTUNREACH: the client went away meanwhile
            log.info("reply to %s dropped: %s", client.hex(), e)

    def _serve(self, client, op, msg):
        blobs = self.blobs
        if op == "put":
            blobs.put(client, msg["ns"], msg["key"], msg["blob"])
            return {}
        if op == "get":
            return {"blob": blobs.get(client, msg["ns"], msg["key"])}
        if op == "delete":
            blobs.delete(client, msg["ns"], msg["key"])
            return None
        if op == "release":
            return {"freed": blobs.release(client, msg["ns"])}
        if op == "stats":
            return {"stats": blobs.stats(client)}
        if op == "hello":
            return {"name": self.endpoint, "pid": os.getpid(),
                    "limits": {"memory_bytes": blobs.memory_bytes,
                               "spill_bytes": blobs.spill_bytes}}
        if op == "bye":
            blobs.drop_client(client)
            return None
        raise StoreError(f"unknown op {op!r}")

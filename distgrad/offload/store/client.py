"""A client of the activation store: one DEALER socket owned by one I/O thread.

Callers in any thread hand requests to the owner thread through a queue and a
wake-up pipe; replies come back through waiters (``get``, ``release``, ``stats``)
or callbacks (``put``'s acknowledgement, run on the owner thread). The store's
liveness is libzmq's: ZMTP heartbeats on the connection and the socket monitor
report a store that died, was stopped or closed as a disconnect within
``heartbeat_timeout``; from then on every request fails at once with a
:class:`~distgrad.offload.errors.StoreError` naming the store. Every wait has a
timeout as well.
"""
import itertools
import os
import threading
import time
from collections import deque

import zmq

from ...utils import addresses
from ...utils.lifetimes import join_all
from ...utils.socket_monitor import recv_monitor_event
from ..errors import StoreError
from . import protocol
from .server import DEFAULT_HEARTBEAT_INTERVAL, DEFAULT_HEARTBEAT_TIMEOUT, set_heartbeats

__all__ = ["StoreClient", "DEFAULT_TIMEOUT"]

#: The longest a request waits for its answer (seconds); a dead store is noticed sooner.
DEFAULT_TIMEOUT = 60.0


class _Waiter:
    __slots__ = ("event", "reply", "error")

    def __init__(self):
        self.event = threading.Event()
        self.reply = self.error = None

    def finish(self, reply=None, error=None):
        self.reply, self.error = reply, error
        self.event.set()


class _Callback:
    __slots__ = ("fn",)

    def __init__(self, fn):
        self.fn = fn

    def finish(self, reply=None, error=None):
        self.fn(StoreError(error) if error is not None else None)


class StoreClient:
    """Talk to the store at ``endpoint``; raises :class:`StoreError` if none answers
    within ``connect_timeout`` seconds.

    >>> from distgrad.offload.store import StoreServer
    >>> import numpy as np
    >>> server = StoreServer(memory_bytes=1 << 20).start()
    >>> client = StoreClient(server.endpoint)
    >>> client.put("ns", 1, np.arange(3, dtype=np.uint8), callback=lambda err: None)
    >>> client.get("ns", 1).tolist()
    [0, 1, 2]
    >>> client.close(); server.close()
    """

    def __init__(self, endpoint, *, timeout=DEFAULT_TIMEOUT, connect_timeout=10.0,
                 heartbeat_interval=DEFAULT_HEARTBEAT_INTERVAL,
                 heartbeat_timeout=DEFAULT_HEARTBEAT_TIMEOUT):
        if not isinstance(endpoint, str) or "://" not in endpoint:
            raise ValueError(f"store endpoint must be like 'tcp://host:port', got {endpoint!r}")
        self.endpoint = endpoint
        self.timeout = timeout
        self._heartbeat = (heartbeat_interval, heartbeat_timeout)
        self._ids = itertools.count(1)
        self._outbox = deque()
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_w, False)
        self._dead = None          # why the store is unusable, once it is
        self._closing = False
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, name="distgrad-store-client",
                                        daemon=True)
        self._thread.start()
        self._ready.wait(10.0)
        try:
            hello = self._call({"op": "hello"}, connect_timeout,
                               f"no activation store answers at {endpoint}")
        except StoreError:
            self.close()
            raise
        self.store_pid = hello.get("pid")
        self.limits = hello.get("limits")

    # ------------------------------------------------------------ requests
    def put(self, ns, key, blob, callback):
        """Store ``blob`` (uint8 array); ``callback(error_or_None)`` runs on acknowledgement."""
        self._submit({"op": "put", "ns": ns, "key": key, "blob": blob}, _Callback(callback))

    def get(self, ns, key, timeout=None):
        """The blob stored under ``key`` (a read-only uint8 array over the received frame)."""
        reply = self._call({"op": "get", "ns": ns, "key": key}, timeout,
                           f"activation store at {self.endpoint} did not return blob {key!r}")
        return reply["blob"]

    def delete(self, ns, key):
        if self._dead is None:
            self._submit({"op": "delete", "ns": ns, "key": key}, None)

    def release(self, ns, timeout=None):
        """Delete every blob of namespace ``ns``; return how many there were."""
        return self._call({"op": "release", "ns": ns}, timeout,
                          f"activation store at {self.endpoint} did not release {ns!r}")["freed"]

    def stats(self, timeout=None):
        return self._call({"op": "stats"}, timeout,
                          f"activation store at {self.endpoint} did not send its stats")["stats"]

    @property
    def dead(self):
        """Why the store is unusable (a message), or None while it is alive."""
        return self._dead

    def close(self):
        """Say bye (the store frees this client's blobs) and stop the I/O thread."""
        if self._closing:
            return
        if self._dead is None:
            self._submit({"op": "bye"}, None)
        self._closing = True
        self._wake()
        join_all([self._thread], 10.0, "activation store client")  # (not itself)

    # ------------------------------------------------------------ plumbing
    def _call(self, message, timeout, what):
        waiter = _Waiter()
        self._submit(message, waiter)
        timeout = self.timeout if timeout is None else timeout
        if not waiter.event.wait(timeout):
            raise StoreError(f"{what} within {timeout:g} s")
        if waiter.error is not None:
            raise StoreError(waiter.error)
        return waiter.reply

    def _submit(self, message, waiter):
        if self._dead is not None or self._closing:
            if waiter is not None:
                waiter.finish(error=self._dead or f"client of {self.endpoint} is closed")
            return
        if waiter is not None:
            message["id"] = next(self._ids)
        self._outbox.append((message, waiter))
        self._wake()

    def _wake(self):
        try:
            os.write(self._wake_w, b"x")
        except (BlockingIOError, OSError):
            pass

    def _run(self):
        ctx = zmq.Context(io_threads=1)
        sock = ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        set_heartbeats(sock, *self._heartbeat)
        monitor = sock.get_monitor_socket(zmq.EVENT_HANDSHAKE_SUCCEEDED | zmq.EVENT_DISCONNECTED)
        pending = {}   # request id -> (waiter, deadline)
        try:
            sock.ipv6 = addresses.is_ipv6(self.endpoint)
            sock.connect(self.endpoint)
            self._ready.set()
            poller = zmq.Poller()
            poller.register(sock, zmq.POLLIN)
            poller.register(monitor, zmq.POLLIN)
            poller.register(self._wake_r, zmq.POLLIN)
            while True:
                ready = dict(poller.poll(200))
                if self._wake_r in ready:
                    os.read(self._wake_r, 4096)
                self._watch(monitor, pending)
                self._send_outbox(sock, pending)
                if sock in ready:
                    self._receive(sock, pending)
                self._expire(pending)
                if self._closing and not self._outbox:
                    break
        finally:
            self._fail(pending, self._dead or f"client of {self.endpoint} is closed")
            monitor.close(0)
            sock.close(0)
            ctx.term()
            for fd in (self._wake_r, self._wake_w):
                try:
                    os.close(fd)
                except OSError:
                    pass

    def _watch(self, monitor, pending):
        while True:
            try:
                event, _ = recv_monitor_event(monitor, zmq.NOBLOCK)
            except zmq.Again:
                return
            if event == zmq.EVENT_DISCONNECTED and self._dead is None:
                self._dead = (f"activation store at {self.endpoint} is gone: the connection "
                              f"was lost (the store died, was stopped or closed; heartbeat "
                              f"timeout {self._heartbeat[1]:g} s)")
                self._fail(pending, self._dead)

    def _send_outbox(self, sock, pending):
        while self._outbox:
            message, waiter = self._outbox.popleft()
            if self._dead is not None:
                if waiter is not None:
                    waiter.finish(error=self._dead)
                continue
            try:
                sock.send_multipart(protocol.encode(message), copy=False)
            except (zmq.ZMQError, TypeError, ValueError) as e:
                if waiter is not None:
                    waiter.finish(error=f"could not send {message['op']} to the activation "
                                        f"store at {self.endpoint}: {e}")
                continue
            if waiter is not None:
                pending[message["id"]] = (waiter, time.monotonic() + self.timeout)

    def _receive(self, sock, pending):
        while True:
            try:
                frames = sock.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                return
            try:
                reply = protocol.decode_reply(frames)
            except protocol.ProtocolError:
                continue
            entry = pending.pop(reply["id"], None)
            if entry is None:
                continue
            waiter = entry[0]
            if "error" in reply:
                waiter.finish(error=f"activation store at {self.endpoint} refused: "
                                    f"{reply['error']}")
            else:
                waiter.finish(reply=reply)

    def _expire(self, pending):
        if not pending:
            return
        now = time.monotonic()
        for rid in [rid for rid, (_, deadline) in pending.items() if deadline < now]:
            waiter, _ = pending.pop(rid)
            waiter.finish(error=f"activation store at {self.endpoint} did not answer within "
                                f"{self.timeout:g} s")

    def _fail(self, pending, why):
        for waiter, _ in pending.values():
            waiter.finish(error=why)
        pending.clear()
        while self._outbox:
            _, waiter = self._outbox.popleft()
            if waiter is not None:
                waiter.finish(error=why)

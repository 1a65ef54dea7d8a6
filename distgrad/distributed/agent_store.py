"""The store of a torchrun agent, reached with PyTorch's own TCPStore wire protocol.

Under ``torchrun`` (``python -m torch.distributed.run``), the launching agent
already serves a c10d ``TCPStore`` on ``MASTER_ADDR:MASTER_PORT`` and tells its
workers so with ``TORCHELASTIC_USE_AGENT_STORE=True``; a worker must not try to
listen there itself. :class:`AgentStore` is a client of that server for
distgrad's process groups: each request is a command byte and its arguments
(strings and byte strings as a little-endian ``uint64`` length and the bytes,
integers as ``int64``; keys, as PyTorch's clients send them, start with ``/``), over one TCP connection that first identifies itself
(a magic number) and proves the server answers (a ping). What it implements is
what the process group's rendezvous needs: ``set``, ``get``, ``add``,
``compare_set``, ``wait``, ``check``, ``delete_key``, ``num_keys``, ``append``,
``multi_get``, ``multi_set``. In a worker that torchrun started::

    store = AgentStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]))
    store.add("joined", 1)
"""
import os
import socket
import struct
import threading
import time

from .errors import DistNetworkError, DistStoreError
from .store import _DEFAULT_TIMEOUT, PrefixStore, Store, _timeout_error

__all__ = ["AgentStore", "attempt_store", "uses_agent_store"]

_MAGIC = 0x3C85F7CE
_VALIDATE, _SET, _COMPARE_SET, _GET, _ADD, _CHECK, _WAIT, _GETNUMKEYS, _DELETE_KEY, _APPEND, \
    _MULTI_GET, _MULTI_SET, _CANCEL_WAIT, _PING = range(14)
_READY = 0                            # a CHECK answer; NOT_READY is 1
_STOP_WAITING, _WAIT_CANCELED = 0, 1  # WAIT answers
_MAX_VALUE = 1 << 30                  # what this client accepts in one answer
_KEY_PREFIX = b"/"                    # PyTorch's TCPStore clients store key k as "/k"


def uses_agent_store(env=None):
    """Whether this process runs under a torchrun agent whose store it must use."""
    env = os.environ if env is None else env
    return env.get("TORCHELASTIC_USE_AGENT_STORE") == "True"  # exactly as PyTorch tests it


def attempt_store(host, port, timeout, env=None):
    """PyTorch's worker-side view of the agent's store at ``host:port``: its keys under the
    prefix of this restart attempt (``/worker/attempt_N``); and the client, to close."""
    env = os.environ if env is None else env
    client = AgentStore(host, port, timeout=timeout)
    attempt = env.get("TORCHELASTIC_RESTART_COUNT", "0")
    return PrefixStore(f"/worker/attempt_{attempt}", client), client


class AgentStore(Store):
    """A client of a c10d TCPStore server (a torchrun agent's), with the Store API."""

    def __init__(self, host_name, port, timeout=_DEFAULT_TIMEOUT):
        super().__init__(timeout)
        self.host, self.port = host_name, int(port)
        self._lock = threading.Lock()   # one request at a time on the one connection
        self._sock = self._connect()

    def _connect(self):
        deadline = time.monotonic() + self._timeout
        while True:
            try:
                sock = socket.create_connection((self.host, self.port),
                                                timeout=max(0.1, deadline - time.monotonic()))
                break
            except OSError as e:
                if time.monotonic() >= deadline:
                    raise DistNetworkError(
                        f"cannot reach the torchrun agent's store at {self.host}:{self.port}: "
                        f"{e} (TORCHELASTIC_USE_AGENT_STORE=True names it)") from None
                time.sleep(0.05)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            nonce = os.getpid() & 0xFFFFFFFF
            sock.settimeout(self._timeout)
            sock.sendall(struct.pack("<BI", _VALIDATE, _MAGIC) + struct.pack("<BI", _PING, nonce))
            if struct.unpack("<I", _recv_exact(sock, 4, self))[0] != nonce:
                raise DistNetworkError(f"the server at {self.host}:{self.port} is not a c10d "
                                       "TCPStore (it answered the ping wrongly)")
        except BaseException:
            sock.close()
            raise
        return sock

    # ------------------------------------------------------------------ the wire
    def _send(self, command, *parts):
        self._sock.sendall(bytes([command]) + b"".join(parts))

    def _recv_bytes(self):
        (n,) = struct.unpack("<Q", _recv_exact(self._sock, 8, self))
        if n > _MAX_VALUE:
            raise DistStoreError(f"the store at {self.host}:{self.port} sent a value of {n} "
                                 "bytes")
        return _recv_exact(self._sock, n, self)

    def _recv_int(self):
        return struct.unpack("<q", _recv_exact(self._sock, 8, self))[0]

    def _recv_byte(self):
        return _recv_exact(self._sock, 1, self)[0]

    def _wait(self, keys, timeout):
        """Block until ``keys`` exist (DistStoreError after ``timeout`` seconds)."""
        self._send(_WAIT, _u64(len(keys)), *(_string(k) for k in keys))
        self._sock.settimeout(timeout if timeout and timeout > 0 else None)
        try:
            answer = self._recv_byte()
        except socket.timeout:
            self._sock.settimeout(self._timeout)
            self._send(_CANCEL_WAIT)
            answer = self._recv_byte()
            if answer == _STOP_WAITING:  # it came just before the cancel: read the ack too
                answer = self._recv_byte()
            raise _timeout_error(keys, timeout) from None
        finally:
            self._sock.settimeout(self._timeout)
        if answer != _STOP_WAITING:
            raise DistStoreError(f"the store at {self.host}:{self.port} answered a wait with "
                                 f"{answer}")

    def _call(self, op, *args):
        with self._lock:
            if self._sock is None:
                raise DistStoreError(f"the store client of {self.host}:{self.port} is closed")
            try:
                return self._request(op, args)
            except OSError as e:  # timeouts, resets: the connection is unusable now
                raise DistNetworkError(f"the torchrun agent's store at {self.host}:{self.port} "
                                       f"failed during {op!r}: {e}") from None

    def _request(self, op, args):
        if op == "set":
            key, value = args
            self._send(_SET, _string(key), _blob(value))
        elif op == "get":
            key, timeout = args
            self._wait([key], timeout)
            self._send(_GET, _string(key))
            return self._recv_bytes()
        elif op == "add":
            key, amount = args
            self._send(_ADD, _string(key), struct.pack("<q", amount))
            return self._recv_int()
        elif op == "compare_set":
            key, expected, desired = args
            self._send(_COMPARE_SET, _string(key), _blob(expected), _blob(desired))
            return self._recv_bytes()
        elif op == "wait":
            keys, timeout = args
            self._wait(list(keys), timeout)
        elif op == "check":
            (keys,) = args
            self._send(_CHECK, _u64(len(keys)), *(_string(k) for k in keys))
            return self._recv_byte() == _READY
        elif op == "delete_key":
            (key,) = args
            self._send(_DELETE_KEY, _string(key))
            return self._recv_int() == 1
        elif op == "num_keys":
            self._send(_GETNUMKEYS)
            return self._recv_int()
        elif op == "append":
            key, value = args
            self._send(_APPEND, _string(key), _blob(value))
        elif op == "multi_get":
            keys, timeout = args
            self._wait(list(keys), timeout)
            self._send(_MULTI_GET, _u64(len(keys)), *(_string(k) for k in keys))
            return [self._recv_bytes() for _ in keys]
        elif op == "multi_set":
            keys, values = args
            self._send(_MULTI_SET, _u64(len(keys)),
                       *(_string(k) + _blob(v) for k, v in zip(keys, values)))
        elif op == "list_keys":
            raise DistStoreError("a c10d TCPStore cannot list its keys")
        else:
            raise ValueError(f"unknown store operation {op!r}")
        return None

    def close(self):
        with self._lock:
            if self._sock is not None:
                self._sock.close()
                self._sock = None

    def __repr__(self):
        return f"AgentStore({self.host}:{self.port})"


def _u64(n):
    return struct.pack("<Q", n)


def _string(key):
    data = _KEY_PREFIX + key.encode()
    return _u64(len(data)) + data


def _blob(value):
    return _u64(len(value)) + bytes(value)


def _recv_exact(sock, n, store):
    chunks, left = [], n
    while left:
        chunk = sock.recv(min(left, 1 << 20))
        if not chunk:
            raise DistNetworkError(f"the torchrun agent's store at {store.host}:{store.port} "
                                   "closed the connection")
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)

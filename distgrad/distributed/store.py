"""Key-value stores with ``torch.distributed``'s API: ``TCPStore``, ``HashStore``, ``PrefixStore``.

A store holds bytes under string keys. ``get`` and ``wait`` block until the keys
exist (or the store's timeout passes: :class:`DistStoreError`); ``add`` keeps a
counter (its value is the decimal text, as PyTorch stores it); ``compare_set``
swaps a value only if it is the expected one. Process groups meet through one
(see ``process_group.py``), and programs use it to exchange small data.

>>> from datetime import timedelta
>>> server = TCPStore("127.0.0.1", 0, is_master=True, timeout=timedelta(seconds=5))
>>> client = TCPStore("127.0.0.1", server.port, is_master=False)
>>> client.add("joined", 1), server.add("joined", 1), client.get("joined")
(1, 2, b'2')

``TCPStore``: the master process runs the server (a ZeroMQ ROUTER on one thread
that owns it, shared with an RPC rendezvous at the same address: see
:class:`distgrad.rpc.rendezvous.MeetingPoint`); every ``TCPStore`` object talks to it through the calling thread's
own socket. Waiting ``get``/``wait`` requests are parked in the server and
answered when their keys appear, so nobody polls. The server bounds what clients
may store (key length, value size, number of keys, parked waiters) and answers
every malformed request with an error; nothing is unpickled.
"""
import datetime
import itertools
import logging
import threading
import time

import msgpack
import zmq

from ..rpc.rendezvous import MeetingPoint, RendezvousError
from ..utils import addresses
from .errors import DistNetworkError, DistStoreError

__all__ = ["Store", "HashStore", "TCPStore", "PrefixStore"]

log = logging.getLogger("distgrad.distributed")

_DEFAULT_TIMEOUT = datetime.timedelta(seconds=300)
_MAX_KEY = 4096
_MAX_VALUE = 64 << 20
_MAX_KEYS = 1_000_000
_MAX_WAITERS = 100_000
_REPLY_SLACK = 5.0          # how much longer than its own timeout a client waits for an answer
# Bookkeeping keys, hidden from num_keys/list_keys (every key that starts with NUL): the
# count of connected clients (or of a file store's users), of a file store's users that
# closed it, and the RPC rendezvous record a file:// init_rpc keeps in the same file.
_HIDDEN = "\x00"
_MEMBERS_KEY = _HIDDEN + "members"
_FINISHED_KEY = _HIDDEN + "finished"


def seconds(timeout, default=None):
    """A timeout given as a ``timedelta`` or a number of seconds, in seconds."""
    if timeout is None:
        return default
    if isinstance(timeout, datetime.timedelta):
        return timeout.total_seconds()
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)):
        raise TypeError(f"timeout must be a datetime.timedelta or a number of seconds, not "
                        f"{type(timeout).__name__}")
    return float(timeout)


def _bytes(value, what="value"):
    if isinstance(value, str):
        return value.encode()
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value)
    if isinstance(value, list) and all(isinstance(b, int) and 0 <= b < 256 for b in value):
        return bytes(value)  # PyTorch's C++ API takes a vector of uint8 too
    raise TypeError(f"store {what} must be str or bytes, not {type(value).__name__}")


def _key(key):
    if not isinstance(key, str):
        raise TypeError(f"store key must be a str, not {type(key).__name__}")
    return key


class _Table:
    """The keys and values of a store, and its operations (no locking, no waiting)."""

    def __init__(self):
        self.data = {}

    def missing(self, keys):
        return [k for k in keys if k not in self.data]

    def set(self, key, value):
        if key not in self.data and len(self.data) >= _MAX_KEYS:
            raise DistStoreError(f"the store holds {_MAX_KEYS} keys already; cannot add {key!r}")
        self.data[key] = value

    def add(self, key, amount):
        old = self.data.get(key, b"0")
        try:
            value = int(old) + amount
        except ValueError:
            raise ValueError(f"store key {key!r} holds {old[:40]!r}, not a counter") from None
        self.set(key, str(value).encode())
        return value

    def compare_set(self, key, expected, desired):
        cur = self.data.get(key)
        if cur is None:
            if expected == b"":
                self.set(key, desired)
                return desired
            return expected
        if cur == expected:
            self.data[key] = desired
            return desired
        return cur

    def append(self, key, value):
        self.set(key, self.data.get(key, b"") + value)

    def delete(self, key):
        return self.data.pop(key, None) is not None

    def user_keys(self):
        return [k for k in self.data if not k.startswith(_HIDDEN)]


class Store:
    """The store API (``torch.distributed.Store``). Subclasses implement ``_call``."""

    def __init__(self, timeout=_DEFAULT_TIMEOUT):
        self._timeout = seconds(timeout)

    @property
    def timeout(self):
        return datetime.timedelta(seconds=self._timeout)

    def set_timeout(self, timeout):
        self._timeout = seconds(timeout)

    def has_extended_api(self):
        return True

    def set(self, key, value):
        self._call("set", _key(key), _bytes(value))

    def _wait_timeout(self):
        return self._timeout

    def get(self, key):
        """The value of ``key``, waiting up to the store's timeout for it to be set."""
        return self._call("get", _key(key), self._wait_timeout())

    def add(self, key, amount):
        if isinstance(amount, bool) or not isinstance(amount, int):
            raise TypeError(f"add(): amount must be an int, not {type(amount).__name__}")
        return self._call("add", _key(key), amount)

    def compare_set(self, key, expected_value, desired_value):
        return self._call("compare_set", _key(key), _bytes(expected_value, "expected_value"),
                          _bytes(desired_value, "desired_value"))

    def wait(self, keys, timeout=None):
        keys = [_key(k) for k in keys]
        self._call("wait", keys, self._wait_timeout() if timeout is None else seconds(timeout))

    def check(self, keys):
        return self._call("check", [_key(k) for k in keys])

    def delete_key(self, key):
        return self._call("delete_key", _key(key))

    def num_keys(self):
        return self._call("num_keys")

    def list_keys(self):
        return self._call("list_keys")

    def append(self, key, value):
        self._call("append", _key(key), _bytes(value))

    def multi_get(self, keys):
        return self._call("multi_get", [_key(k) for k in keys], self._wait_timeout())

    def multi_set(self, keys, values):
        keys, values = list(keys), list(values)
        if len(keys) != len(values):
            raise ValueError(f"multi_set(): {len(keys)} keys but {len(values)} values")
        self._call("multi_set", [_key(k) for k in keys], [_bytes(v) for v in values])

    def _call(self, op, *args):
        raise NotImplementedError


def _timeout_error(keys, timeout):
    return DistStoreError(f"wait timeout after {timeout * 1000:.0f}ms, keys: "
                          f"{', '.join(repr(k) for k in keys[:8])}"
                          + (f" and {len(keys) - 8} more" if len(keys) > 8 else ""))


def _apply(table, op, args):
    """Run a non-waiting operation on ``table``; the waiting ones (get, wait, multi_get)
    arrive here once their keys exist."""
    if op == "set":
        table.set(*args)
    elif op == "get":
        return table.data[args[0]]
    elif op == "add":
        return table.add(*args)
    elif op == "compare_set":
        return table.compare_set(*args)
    elif op == "wait":
        return None
    elif op == "check":
        return not table.missing(args[0])
    elif op == "delete_key":
        return table.delete(args[0])
    elif op == "num_keys":
        return len(table.user_keys())
    elif op == "list_keys":
        return table.user_keys()
    elif op == "append":
        table.append(*args)
    elif op == "multi_get":
        return [table.data[k] for k in args[0]]
    elif op == "multi_set":
        for k, v in zip(*args):
            table.set(k, v)
    else:
        raise ValueError(f"unknown store operation {op!r}")
    return None


def _waits_for(op, args):
    """The keys a request waits for, and its timeout (None: it does not wait)."""
    if op == "get":
        return [args[0]], args[1]
    if op in ("wait", "multi_get"):
        return args[0], args[1]
    return None, None


class HashStore(Store):
    """A store inside this process (threads share it), as ``torch.distributed.HashStore``."""

    def __init__(self):
        super().__init__()
        self._table = _Table()
        self._cv = threading.Condition()

    def _call(self, op, *args):
        keys, timeout = _waits_for(op, args)
        with self._cv:
            if keys is not None and not self._cv.wait_for(
                    lambda: not self._table.missing(keys), timeout if timeout > 0 else None):
                raise _timeout_error(self._table.missing(keys), timeout)
            result = _apply(self._table, op, args)
            self._cv.notify_all()
            return result


# ---------------------------------------------------------------------- TCPStore
def _bind_address(host, port):
    try:
        return addresses.endpoint(addresses.listen_address(host), port)
    except addresses.AddressError as e:
        raise DistNetworkError(f"the store cannot listen at {host}:{port}: {e}") from None


def _valid_request(req):
    """(request id, op, args) of a decoded request, or a text saying what is wrong."""
    if type(req) is not list or len(req) != 3 or type(req[0]) is not int \
            or type(req[1]) is not str or type(req[2]) is not list:
        return "a request is [id, op, args]"
    rid, op, args = req
    for a in args:
        items = a if type(a) is list else [a]
        for x in items:
            if type(x) is str and len(x) > _MAX_KEY:
                return f"key of {len(x)} characters (the limit is {_MAX_KEY})"
            if type(x) not in (str, bytes, int, float):
                return f"argument of type {type(x).__name__}"
    shapes = {"set": (str, bytes), "get": (str, (int, float)), "add": (str, int),
              "compare_set": (str, bytes, bytes), "wait": (list, (int, float)),
              "check": (list,), "delete_key": (str,), "num_keys": (), "list_keys": (),
              "append": (str, bytes), "multi_get": (list, (int, float)),
              "multi_set": (list, list), "hello": ()}
    shape = shapes.get(op)
    if shape is None:
        return f"unknown operation {op!r}"
    if len(args) != len(shape) or not all(isinstance(a, t) for a, t in zip(args, shape)):
        return f"malformed arguments for {op!r}"
    return rid, op, args


def _store_bind_error(address, e):
    hint = (" (another process uses this port: choose another MASTER_PORT)"
            if e.errno == zmq.EADDRINUSE else "")
    return DistNetworkError(f"the store cannot listen on {address[len('tcp://'):]}: {e}{hint}")


class _StoreServer:
    """The master's side of a TCPStore: a handler of the :class:`MeetingPoint` at its
    address (whose one thread owns the socket), so that an RPC rendezvous at the same
    address shares it, as PyTorch's RPC shares the process group's store."""

    accepts = "array"

    def __init__(self, host, port, curve=None):
        try:
            self.point = MeetingPoint.acquire(_bind_address(host, port), curve=curve,
                                              max_message=_MAX_VALUE + 2 * _MAX_KEY + 1024,
                                              bind_error=_store_bind_error)
        except RendezvousError as e:
            raise DistNetworkError(f"the store cannot listen on {host}:{port}: {e}") from None
        try:
            self.point.attach(self)
        except RendezvousError as e:
            self.point.release()
            raise DistNetworkError(f"the store cannot listen on {host}:{port}: {e}") from None
        self.port = int(self.point.address.rsplit(":", 1)[1])
        self.table = _Table()
        self.waiters = {}           # (ident, rid) -> (op, args, keys, deadline)
        self.users = 1

    # the meeting point's handler interface (its serving thread calls these)
    def next_deadline(self):
        return min((w[3] for w in self.waiters.values()), default=float("inf"))

    def tick(self, point, now):
        self._expire(now)

    def failed(self, point, error):
        pass  # the clients' requests time out, naming the store

    def _reply(self, ident, rid, ok, value):
        self.point.send(ident, msgpack.packb([rid, ok, value]))

    def on_frame(self, point, ident, frame):
        try:
            req = msgpack.unpackb(frame, raw=False, max_bin_len=_MAX_VALUE,
                                  max_str_len=_MAX_KEY, max_array_len=100_000)
        except Exception:  # noqa: BLE001 - garbage on the port
            self._reply(ident, 0, False, ["ValueError", "malformed store request"])
            return
        req = _valid_request(req)
        if isinstance(req, str):
            self._reply(ident, 0, False, ["ValueError", f"malformed store request: {req}"])
            return
        rid, op, args = req
        if op == "hello":
            self._run(ident, rid, "add", [_MEMBERS_KEY, 1])
            return
        keys, timeout = _waits_for(op, args)
        if keys is not None and self.table.missing(keys):
            if len(self.waiters) >= _MAX_WAITERS:
                self._reply(ident, rid, False, ["DistStoreError", "too many waiting requests"])
                return
            deadline = time.monotonic() + (timeout if timeout > 0 else 1e9)
            self.waiters[(ident, rid)] = (op, args, keys, deadline)
            return
        self._run(ident, rid, op, args)

    def _run(self, ident, rid, op, args):
        try:
            result = _apply(self.table, op, args)
        except (ValueError, DistStoreError) as e:
            self._reply(ident, rid, False, [type(e).__name__, str(e)])
            return
        self._reply(ident, rid, True, result)
        if op in ("set", "add", "compare_set", "append", "multi_set") and self.waiters:
            for key, (wop, wargs, keys, _) in list(self.waiters.items()):
                if not self.table.missing(keys):
                    del self.waiters[key]
                    self._run(key[0], key[1], wop, wargs)

    def _expire(self, now):
        for key, (op, args, keys, deadline) in list(self.waiters.items()):
            if now >= deadline:
                del self.waiters[key]
                err = _timeout_error(self.table.missing(keys), _waits_for(op, args)[1])
                self._reply(key[0], key[1], False, ["DistStoreError", str(err)])

    def stop(self):
        self.point.detach(self)
        self.point.release()


_servers = {}   # (host, port) -> _StoreServer shared by multi-tenant TCPStores of this process
_servers_lock = threading.Lock()


class _OwnedSocket:
    """A thread's DEALER to a store server, closed when the thread or the store is gone."""

    __slots__ = ("sock",)

    def __init__(self, address, curve=None):
        self.sock = zmq.Context.instance().socket(zmq.DEALER)
        self.sock.linger = 0
        self.sock.ipv6 = 1
        if curve is not None:  # the server's pair is the world's: holding it is the credential
            self.sock.curve_serverkey = self.sock.curve_publickey = curve[0]
            self.sock.curve_secretkey = curve[1]
        self.sock.connect(address)

    def __del__(self):
        try:
            self.sock.close(linger=0)
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass


_request_ids = itertools.count(1)


class TCPStore(Store):
    """A store served over TCP by the master process, as ``torch.distributed.TCPStore``.

    ``port=0`` with ``is_master=True`` picks a free port (read it from ``.port``).
    With ``world_size`` and ``wait_for_workers``, the master's constructor waits
    until that many stores (itself included) have connected. ``multi_tenant``
    lets several master stores of one process share the server at one address.
    ``curve`` (distgrad only): a CURVE key pair (public, secret; Z85) that the server
    and all its clients hold, and nobody else: the connections are encrypted and a
    process without the pair is not answered (the torchrun agents' store derives it
    from the world secret, ``elastic/rendezvous/rendezvous_store.py``).
    """

    def __init__(self, host_name, port, world_size=None, is_master=False,
                 timeout=_DEFAULT_TIMEOUT, wait_for_workers=True, multi_tenant=False,
                 master_listen_fd=None, use_libuv=True, *, curve=None):
        super().__init__(timeout)
        if not isinstance(host_name, str) or not host_name:
            raise TypeError("TCPStore(): host_name must be a non-empty str")
        if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port < 65536:
            raise ValueError(f"TCPStore(): port must be an int in 0..65535, not {port!r}")
        if master_listen_fd is not None:
            raise ValueError("TCPStore(): master_listen_fd is not supported; pass a port")
        self.host, self.world_size = host_name, world_size
        self._server = None
        self._closed = False
        self._local = threading.local()   # .owned: this thread's _OwnedSocket
        if is_master:
            with _servers_lock:
                shared = _servers.get((host_name, port)) if multi_tenant and port else None
                if shared is not None:
                    shared.users += 1
                    self._server = shared
                else:
                    self._server = _StoreServer(host_name, port, curve)
                    if multi_tenant:
                        _servers[(host_name, self._server.port)] = self._server
            port = self._server.port
        elif port == 0:
            raise ValueError("TCPStore(): a client (is_master=False) needs the master's port")
        self.port = port
        self._curve = curve
        self._address = addresses.endpoint(host_name, port)
        self._call("hello")
        if is_master and wait_for_workers and world_size:
            self._wait_members(world_size)

    @property
    def served_at(self):
        """The endpoint this store's server listens on when this process serves it (the
        master), else None."""
        return self._server.point.address if self._server is not None else None

    def _wait_members(self, world_size):
        deadline = time.monotonic() + self._timeout
        while int(self._call("add", _MEMBERS_KEY, 0)) < world_size:
            if time.monotonic() > deadline:
                joined = int(self._call("add", _MEMBERS_KEY, 0))
                raise DistStoreError(f"Timed out after {self._timeout:g} s waiting for clients: "
                                     f"{joined}/{world_size} clients joined the store at "
                                     f"{self.host}:{self.port}")
            time.sleep(0.01)

    def _socket(self):
        owned = getattr(self._local, "owned", None)
        if owned is None:
            owned = self._local.owned = _OwnedSocket(self._address, self._curve)
        return owned.sock

    def _call(self, op, *args):
        if self._closed:
            raise DistStoreError(f"the TCPStore at {self.host}:{self.port} was shut down")
        sock = self._socket()
        rid = next(_request_ids)
        wait = _waits_for(op, args)[1]
        budget = (wait if wait and wait > 0 else self._timeout) + _REPLY_SLACK
        try:
            sock.send(msgpack.packb([rid, op, list(args)]))
        except zmq.ZMQError as e:
            raise DistNetworkError(f"cannot send to the store at {self.host}:{self.port}: {e}") \
                from None
        deadline = time.monotonic() + budget
        while True:
            left = deadline - time.monotonic()
            if left <= 0 or not sock.poll(int(left * 1000) + 1):
                raise DistNetworkError(
                    f"the store at {self.host}:{self.port} did not answer {op!r} within "
                    f"{budget:g} s ({addresses.diagnose(self._address)}): is the master "
                    "process running, and do MASTER_ADDR/MASTER_PORT (or init_method) name "
                    "it?")
            rrid, ok, value = msgpack.unpackb(sock.recv(), raw=False)
            if rrid == rid or rrid == 0:
                break  # other ids: late answers to requests that timed out here
        if ok:
            return value
        kind, message = value
        raise (ValueError if kind == "ValueError" else DistStoreError)(message)

    def close(self):
        """Stop serving (master) and forget this store's sockets; later calls fail."""
        if self._closed:
            return
        self._closed = True
        self._local = threading.local()
        server, self._server = self._server, None
        if server is not None:
            with _servers_lock:
                server.users -= 1
                if server.users > 0:
                    return
                _servers.pop((self.host, server.port), None)
            server.stop()

    def __del__(self):
        try:
            if self._server is not None:
                self.close()
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass

    def __repr__(self):
        role = "server" if self._server is not None else "client"
        return f"TCPStore({role}, {self.host}:{self.port})"


class PrefixStore(Store):
    """Every key of ``store`` seen through ``prefix + "/"`` (``torch.distributed.PrefixStore``)."""

    def __init__(self, prefix, store):
        if not isinstance(store, Store):
            raise TypeError(f"PrefixStore(): store must be a Store, not {type(store).__name__}")
        super().__init__(store.timeout)
        self.prefix, self.underlying_store = prefix, store

    @property
    def timeout(self):
        return self.underlying_store.timeout

    def set_timeout(self, timeout):
        self.underlying_store.set_timeout(timeout)

    def _k(self, key):
        return f"{self.prefix}/{_key(key)}"

    def _call(self, op, *args):
        if op in ("num_keys", "list_keys"):
            p = f"{self.prefix}/"
            keys = [k[len(p):] for k in self.underlying_store.list_keys() if k.startswith(p)]
            return keys if op == "list_keys" else len(keys)
        if op in ("wait", "check", "multi_get", "multi_set"):
            args = ([self._k(k) for k in args[0]],) + args[1:]
        else:
            args = (self._k(args[0]),) + args[1:]
        return self.underlying_store._call(op, *args)

    def _wait_timeout(self):
        return self.underlying_store._wait_timeout()

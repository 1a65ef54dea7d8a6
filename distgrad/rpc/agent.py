"""The RPC agent: one per process, owning the sockets and dispatching requests.

Threads and sockets
    A ROUTER bound on this process's endpoint takes requests in and replies out;
    one DEALER per peer sends requests and takes their replies. These sockets are
    owned by whichever crew thread holds the *role* (leader/follower, see
    ``_crew_run``): the leader polls, and when a request arrives it hands the role
    on and runs the request itself, so a fast handler replies from the thread that
    received it and a slow one never stops the others. Other threads never touch
    those sockets: asynchronous calls append ready-made frames to an outbox and
    wake the leader through a pipe. ``rpc_sync`` does not hop at all: each thread
    has its own DEALER per peer and waits for the reply on it. Heartbeats
    (PING/PONG) are sent and answered by the leader, so a busy worker still looks
    alive; a peer silent for ``heartbeat_timeout`` fails every pending call to it.

Message interceptor (the extension point of distributed autograd)
    ``set_message_interceptor(obj)`` installs a process-wide object with:

    ``on_send(kind, dst_name, payload) -> (payload, extra_or_None)``
        called for every outgoing ``"request"`` (payload = ``(args, kwargs)``) and
        ``"response"`` (payload = the return value) before encoding; ``extra`` is a
        small msgpack-able value carried in the message header.
    ``on_receive(kind, src_name, extra, payload) -> payload``
        called for every incoming request (payload = ``(args, kwargs)``) and
        response (payload = the decoded value) with the sender's header ``extra``.
    ``request_scope(src_name, extra) -> context manager``
        the handler of an incoming request runs inside it, so nested RPCs made by
        the handler can belong to the same (autograd) context.

    Error replies do not pass through the interceptor. ``set_message_interceptor(None)``
    removes it. Responses are decoded on the I/O thread: ``on_receive`` must not block.
"""
import collections
import contextlib
import errno
import itertools
import logging
import os
import threading
import time
import traceback
import uuid

import zmq
from numpy import ndarray as _ndarray

from . import wire
from .errors import (ProtocolError, RefusedCallError, RpcError, RpcTimeoutError,
                     WorkerUnreachableError, describe_exception, rebuild_exception)
from .futures import Future
from .options import DEFAULT_ALLOWED_MODULES, RpcBackendOptions
from .pool import HandlerPool
from .rendezvous import RendezvousServer, join, resolve_address
from .resolve import ref_of, resolve
from .rref import OwnerTable, RRef
from ..utils.tempdirs import owned_tempdir
from .worker_info import WorkerInfo

__all__ = ["Agent", "current_agent", "set_message_interceptor", "get_message_interceptor"]

log = logging.getLogger("distgrad.rpc")
Kind = wire.Kind

_agent = None
_interceptor = None
_ALLOWED_DUNDER_METHODS = {"__call__", "__getitem__", "__len__", "__contains__"}


FOLLOWER_TICK = 0.02  # how often an idle follower checks whether the role is free
_ZERO_COPY_MIN = 1 << 16  # below this, copying is cheaper than pyzmq's zero-copy bookkeeping


def send_frames(sock, frames):
    """Send a multipart message; large array buffers go zero-copy."""
    last = len(frames) - 1
    for i, f in enumerate(frames):
        sock.send(f, zmq.SNDMORE if i < last else 0,
                  copy=not ((type(f) is _ndarray and f.nbytes >= _ZERO_COPY_MIN) or type(f) is zmq.Frame))


def current_agent():
    return _agent


def set_message_interceptor(obj):
    """Install (or with None remove) the process-wide message interceptor; see module doc."""
    global _interceptor
    for m in ("on_send", "on_receive", "request_scope") if obj is not None else ():
        if not callable(getattr(obj, m, None)):
            raise TypeError(f"message interceptor lacks a callable {m}()")
    _interceptor = obj


def get_message_interceptor():
    return _interceptor


class _ThreadSockets(dict):
    """A thread's own sockets; closed when the thread ends (its locals die with it)."""

    def __del__(self):
        for s in self.values():
            try:
                s.close(linger=0)
            except Exception:  # context already gone
                pass


class _Pending:
    __slots__ = ("fut", "dst", "deadline", "what", "timeout")

    def __init__(self, fut, dst, deadline, what, timeout):
        self.fut, self.dst, self.deadline, self.what, self.timeout = fut, dst, deadline, what, timeout


def _curve_of(options):
    if options.curve_public_key is None:
        return None
    return (options.curve_public_key, options.curve_secret_key)


class Agent:
    def __init__(self, name, rank, world_size, options=None):
        if not isinstance(name, str) or not name:
            raise ValueError("worker name must be a non-empty string")
        if not (0 <= rank < world_size):
            raise ValueError(f"rank {rank} out of range for world_size {world_size}")
        self.name, self.rank, self.world_size = name, rank, world_size
        self.options = options = options or RpcBackendOptions()
        self.allowed = tuple(DEFAULT_ALLOWED_MODULES) + tuple(options.allowed_modules)
        self.rrefs = OwnerTable()
        self._resolved = {}  # allowlist checks done once per callable reference
        self.stats = collections.Counter()
        self.running = False
        self._ids = itertools.count(1)
        self._pending = {}
        self._sync_inflight = {}
        self._tls = threading.local()
        self._role = threading.Lock()
        self._crew_lock = threading.Lock()
        self._lead_wanted = threading.Condition(threading.Lock())
        self._outbox = collections.deque()
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)
        self._woken = False
        self._stop = False
        self._closing_linger = 0
        self._next_deadline = float("inf")
        self._dead = {}
        self._barrier = threading.Condition()
        self._arrived = {}
        self._ipc_dir = None
        self.ctx = zmq.Context()
        self._auth = None
        self._internal = {"@rref.fetch": self._op_fetch, "@rref.call": self._op_rref_call,
                          "@rref.add": self._op_fork_add, "@rref.del": self._op_fork_del,
                          "@barrier": self._op_barrier}

    # ------------------------------------------------------------------ startup
    def start(self, rendezvous_server=None):
        opts = self.options
        curve = _curve_of(opts)
        try:
            if curve is not None:
                self._start_auth(curve[0])
            self._router = self._socket(zmq.ROUTER, server=True)
            self._router.router_mandatory = 1
            if opts.transport == "ipc":
                self._ipc_dir = opts.ipc_dir or owned_tempdir("dg-rpc-")
                ep = f"ipc://{self._ipc_dir}/{uuid.uuid4().hex[:12]}.sock"
            else:
                ep = f"tcp://{opts.bind_addr}:0"
            self._router.bind(ep)
            self.endpoint = self._router.last_endpoint.decode()
            server = rendezvous_server
            if server is None and self.rank == 0:
                server = RendezvousServer(self.ctx, resolve_address(opts.init_method), curve)
            if server is not None:
                server.start(self.world_size, opts.rendezvous_timeout)
                address = server.address
            else:
                address = resolve_address(opts.init_method)
            table = join(self.ctx, address, self.name, self.rank, self.world_size, self.endpoint,
                         opts.rendezvous_timeout, curve)
            if server is not None:
                server.join_thread(5.0)
            self.workers = [WorkerInfo(n, r) for n, r, _ in table]
            self._by_name = {w.name: w for w in self.workers}
            self._dealers = []
            self._endpoints = [ep for _, _, ep in table]
            for _, r, peer_ep in table:
                d = self._socket(zmq.DEALER, server=False)
                d.identity = b"%d" % self.rank
                d.connect(peer_ep)
                self._dealers.append(d)
            now = time.monotonic()
            self._last_seen = [now] * self.world_size
            self._pool = HandlerPool(1, name=f"rpc-{self.name}-callbacks")
            self.running = True
            self._start_crew()
        except BaseException:
            self._close_sockets()
            if self._auth is not None:
                self._auth.stop()
            self.ctx.destroy(linger=0)
            for fd in (self._wake_r, self._wake_w):
                os.close(fd)
            raise

    def _start_auth(self, world_public):
        from zmq.auth.thread import ThreadAuthenticator

        class _OnlyWorldKey:
            def callback(self, domain, key):
                return key == zmq.utils.z85.decode(world_public) or key == world_public
        self._auth = ThreadAuthenticator(self.ctx)
        self._auth.start()
        self._auth.configure_curve_callback(domain="*", credentials_provider=_OnlyWorldKey())

    def _socket(self, kind, server):
        s = self.ctx.socket(kind)
        s.linger = 0
        s.sndhwm = 0  # the I/O thread must never block on a full queue
        s.rcvhwm = 0
        curve = _curve_of(self.options)
        if curve is not None:
            public, secret = curve
            s.curve_publickey, s.curve_secretkey = public, secret
            if server:
                s.curve_server = True
            else:
                s.curve_serverkey = public
        return s

    # ------------------------------------------------------------------ public helpers
    def new_id(self):
        return (self.rank, next(self._ids))

    def worker_info(self, to=None):
        if to is None:
            return self.workers[self.rank]
        if isinstance(to, WorkerInfo):
            to = to.id
        if isinstance(to, str):
            w = self._by_name.get(to)
            if w is None:
                raise ValueError(f"unknown worker {to!r}; known: {sorted(self._by_name)}")
            return w
        if isinstance(to, int) and 0 <= to < self.world_size:
            return self.workers[to]
        raise ValueError(f"unknown worker {to!r}")

    def _describe(self, rank):
        return f"worker {self.workers[rank].name!r} (rank {rank})"

    # ------------------------------------------------------------------ sending
    def _post(self, target, frames):
        self._outbox.append((target, frames))
        if not self._role.locked():
            self._wake_follower()
        if not self._woken:
            self._woken = True
            try:
                os.write(self._wake_w, b"x")
            except OSError:  # pipe full (already woken) or closed (shut down)
                pass

    def _timeout_of(self, timeout):
        if timeout is None or timeout < 0:
            timeout = self.options.rpc_timeout
        return timeout if timeout and timeout > 0 else None

    def _prepare(self, to, target, args, kwargs, remote_ref):
        if not self.running:
            raise RuntimeError("RPC agent is not running (init_rpc not called or shut down)")
        dst = self.worker_info(to).id
        if not (isinstance(target, str) and target.startswith("@")):
            target = ref_of(target)
        dead = self._dead.get(dst)
        if dead:
            raise WorkerUnreachableError(f"{self._describe(dst)} is unreachable: {dead}")
        extra = None
        ic = _interceptor
        if ic is not None:
            (args, kwargs), extra = ic.on_send("request", self.workers[dst].name, (args, kwargs))
        body, bufs = wire.encode([target, list(args), kwargs or {}, remote_ref],
                                 lambda r, _d=dst: self._encode_rref(r, _d))
        mid = next(self._ids)
        return dst, target, mid, [wire.pack_header(Kind.CALL, mid, self.rank, extra), body, *bufs]

    def call(self, to, target, args=(), kwargs=None, timeout=-1, remote_ref=None):
        """Send a request; return a Future of its reply. ``target`` is a callable,
        a ``module:qualname`` string or an internal ``@op``."""
        fut = Future()
        try:
            dst, target, mid, frames = self._prepare(to, target, args, kwargs, remote_ref)
        except WorkerUnreachableError as e:
            fut.set_exception(e)
            return fut
        timeout = self._timeout_of(timeout)
        deadline = time.monotonic() + timeout if timeout else float("inf")
        self._pending[mid] = _Pending(fut, dst, deadline, target, timeout)
        if deadline < self._next_deadline:
            self._next_deadline = deadline
        self._post(dst, frames)
        return fut

    def call_sync(self, to, target, args=(), kwargs=None, timeout=-1):
        """Blocking call on the caller's own socket: no thread hop on the hot path.

        Each thread has its own DEALER per peer (a socket belongs to one thread);
        the reply comes back to it, and the wait is sliced so that a dead peer or
        a shut-down agent ends it.
        """
        dst, target, mid, frames = self._prepare(to, target, args, kwargs, None)
        sock = self._thread_socket(dst)
        timeout = self._timeout_of(timeout)
        deadline = time.monotonic() + timeout if timeout else float("inf")
        self._sync_inflight[mid] = dst
        try:
            send_frames(sock, frames)
            if not self._role.locked():  # a handler about to block: let a follower serve
                self._wake_follower()
            while True:
                try:  # RCVTIMEO slices the wait (cheaper than a poll per call)
                    reply = sock.recv_multipart(copy=False)
                except zmq.Again:
                    reply = None
                if reply is not None:
                    try:
                        kind, rmid, _, extra = wire.unpack_header(reply[0].bytes)
                    except ProtocolError as e:
                        self._drop(str(e))
                        continue
                    if rmid != mid:  # the late reply of an earlier, timed-out call
                        self.stats["late_replies"] += 1
                        continue
                    value, exc = self._decode_reply(kind, extra, reply, dst)
                    if exc is not None:
                        raise exc
                    return value
                if time.monotonic() >= deadline:
                    raise RpcTimeoutError(f"RPC ran for more than set timeout ({timeout} s) "
                                          f"calling {target} on {self._describe(dst)}")
                dead = self._dead.get(dst)
                if dead:
                    raise WorkerUnreachableError(
                        f"{self._describe(dst)} is unreachable: {dead} (while calling {target})")
                if not self.running:
                    raise RpcError(f"RPC agent {self.name!r} shut down during a call to {target}")
        finally:
            self._sync_inflight.pop(mid, None)

    def _thread_socket(self, dst):
        socks = getattr(self._tls, "socks", None)
        if socks is None:
            socks = self._tls.socks = _ThreadSockets()
        s = socks.get(dst)
        if s is None:
            s = socks[dst] = self._socket(zmq.DEALER, server=False)
            s.rcvtimeo = 50
            s.connect(self._endpoints[dst])
        return s

    def remote(self, to, target, args=(), kwargs=None, timeout=-1):
        dst = self.worker_info(to).id
        rid, fid = self.new_id(), self.new_id()
        created = self.call(dst, target, args, kwargs, timeout, remote_ref=[rid, fid])
        return RRef._make(self, dst, rid, fid, created)

    # ------------------------------------------------------------------ RRef plumbing
    def _encode_rref(self, rref, dst):
        if rref._rid is None:  # RRef(value) made before init_rpc: adopt it now
            rref._bind(self, self.rank, self.new_id(), self.new_id())
            self.rrefs.add_fork(rref._rid, rref._fid, 1)
            self.rrefs.set_value(rref._rid, rref._value)
        fid = self.new_id()
        if rref._owner == self.rank:
            self.rrefs.add_fork(rref._rid, fid, 1)
        else:
            fut = self.call(rref._owner, "@rref.add", (rref._rid, fid), None, 0)
            fut.add_done_callback(lambda f, _keep=rref: None)  # parent fork lives until acked
        return [rref._owner, list(rref._rid), list(fid)]

    def _resolve(self, ref):
        fn = self._resolved.get(ref)
        if fn is None:
            fn = resolve(ref, self.allowed)
            if len(self._resolved) < 4096:
                self._resolved[ref] = fn
        return fn

    def _decode_rref(self, meta):
        owner, rid, fid = meta
        if not (isinstance(owner, int) and 0 <= owner < self.world_size):
            raise ProtocolError(f"RRef owner {owner!r} out of range")
        return RRef._make(self, owner, tuple(rid), tuple(fid))

    def release_fork(self, owner, rid, fid):
        if not self.running:
            return
        if owner == self.rank:
            self.rrefs.add_fork(rid, fid, -1)
        else:
            self.call(owner, "@rref.del", (rid, fid), None, 0)

    def _op_fork_add(self, rid, fid):
        self.rrefs.add_fork(tuple(rid), tuple(fid), 1)

    def _op_fork_del(self, rid, fid):
        self.rrefs.add_fork(tuple(rid), tuple(fid), -1)

    def _op_fetch(self, rid):
        return self.rrefs.get(tuple(rid), self._timeout_of(-1))

    def _op_rref_call(self, rid, method, args, kwargs):
        if not isinstance(method, str) or (method.startswith("__")
                                           and method not in _ALLOWED_DUNDER_METHODS):
            raise RefusedCallError(f"method {method!r} may not be called through an RRef")
        obj = self.rrefs.get(tuple(rid), self._timeout_of(-1))
        return getattr(obj, method)(*args, **(kwargs or {}))

    # ------------------------------------------------------------------ serving
    def _serve(self, ident, mid, src, extra, frames):
        src_name = self.workers[src].name if 0 <= src < self.world_size else f"rank {src}"
        remote_ref = None
        try:
            if len(frames[0]) > self.options.max_message_size:
                raise ProtocolError(f"request body exceeds {self.options.max_message_size} bytes")
            msg = wire.decode(frames[0].buffer, frames[1:], self._decode_rref, self._resolve)
            if not (isinstance(msg, list) and len(msg) == 4 and isinstance(msg[1], list)
                    and isinstance(msg[2], dict)):
                raise ProtocolError("malformed request body")
            target, args, kwargs, remote_ref = msg
            if remote_ref is not None:
                remote_ref = (tuple(remote_ref[0]), tuple(remote_ref[1]))
                self.rrefs.add_fork(remote_ref[0], remote_ref[1], 1)
            ic = _interceptor
            scope = contextlib.nullcontext()
            if ic is not None:
                args, kwargs = ic.on_receive("request", src_name, extra, (tuple(args), kwargs))
                scope = ic.request_scope(src_name, extra)
            if isinstance(target, str) and target.startswith("@"):
                fn = self._internal.get(target)
                if fn is None:
                    raise RefusedCallError(f"unknown internal operation {target!r}")
            else:
                fn = self._resolve(target)
            with scope:
                result = fn(*args, **kwargs)
            if isinstance(result, Future) and (getattr(fn, "_distgrad_async_execution", False)
                                               or target.startswith("@")):
                result.add_done_callback(
                    lambda f: self._finish(ident, mid, src_name, remote_ref, f))
                return
        except BaseException as e:  # noqa: BLE001 - every error goes back to the caller
            self._reply_error(ident, mid, e, remote_ref)
            return
        self._reply(ident, mid, src_name, result, remote_ref)

    def _finish(self, ident, mid, src_name, remote_ref, fut):
        try:
            result = fut.value()
        except BaseException as e:  # noqa: BLE001
            self._reply_error(ident, mid, e, remote_ref)
            return
        self._reply(ident, mid, src_name, result, remote_ref)

    def _reply(self, ident, mid, src_name, result, remote_ref):
        try:
            if remote_ref is not None:
                self.rrefs.set_value(remote_ref[0], result)
                result = None
            extra = None
            ic = _interceptor
            if ic is not None:
                result, extra = ic.on_send("response", src_name, result)
            src = self._by_name[src_name].id if src_name in self._by_name else None
            body, bufs = wire.encode(result, lambda r: self._encode_rref(r, src))
        except BaseException as e:  # noqa: BLE001
            self._reply_error(ident, mid, e, None)
            return
        self._send_reply([ident, wire.pack_header(Kind.REPLY, mid, self.rank, extra), body, *bufs])

    def _reply_error(self, ident, mid, exc, remote_ref):
        if remote_ref is not None:
            self.rrefs.set_value(remote_ref[0], None, exc)
        tb = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
        body, _ = wire.encode(describe_exception(exc, tb))
        self._send_reply([ident, wire.pack_header(Kind.ERROR, mid, self.rank), body])

    # ------------------------------------------------------------------ the crew
    # Leader/follower: the thread holding ``_role`` is the only one touching the
    # sockets (ownership moves between threads under a lock, the full memory barrier
    # ZeroMQ asks for when a socket migrates). The leader polls; when a request
    # arrives it gives up the role, wakes a follower to lead, and runs the request
    # itself. When the handler is done it tries to take the role back without
    # blocking: for a fast handler the follower has not taken over yet, so the
    # reply goes out from the same thread with no hand-off at all; for a slow one a
    # follower leads meanwhile and the reply is queued for it. Heartbeats are sent
    # and answered by whoever leads, so a worker busy in handlers still looks alive.

    def _start_crew(self):
        self._waiting = 0
        self._standby = None
        self._crew = 0
        self._closed = threading.Event()
        poller = self._poller = zmq.Poller()
        poller.register(self._router, zmq.POLLIN)
        poller.register(self._wake_r, zmq.POLLIN)
        self._dealer_rank = {}
        for r, d in enumerate(self._dealers):
            poller.register(d, zmq.POLLIN)
            self._dealer_rank[d] = r
        self._next_hb = time.monotonic()
        with self._crew_lock:
            for _ in range(max(2, min(self.options.num_worker_threads, 4))):
                self._spawn_member()

    def _spawn_member(self):  # with _crew_lock held
        self._crew += 1
        threading.Thread(target=self._crew_run, name=f"rpc-{self.name}-{self._crew}",
                         daemon=True).start()

    def _crew_run(self):
        # One waiting follower, the standby, checks every FOLLOWER_TICK whether the
        # role is free (a handler turned out slow); the others sleep longer, so an
        # idle process wakes rarely. A standby that becomes leader names a new one.
        me = threading.get_ident()
        idle = 0.0
        while not self._closed.is_set():
            if self._role.acquire(blocking=False):
                idle = 0.0
                if self._standby == me:
                    self._standby = None
                    self._wake_follower()
                job = self._lead()
                if job is None:
                    return
                try:
                    self._serve(*job)
                except BaseException:  # noqa: BLE001 - a crew member must survive its handler
                    log.exception("%s: request handling failed", self.name)
                continue
            with self._lead_wanted:
                with self._crew_lock:
                    self._waiting += 1
                    if self._standby is None:
                        self._standby = me
                    tick = FOLLOWER_TICK if self._standby == me else 1.0
                woke = self._lead_wanted.wait(tick)
                with self._crew_lock:
                    self._waiting -= 1
            if not woke:
                idle += tick
                with self._crew_lock:
                    if idle > 30.0 and self._crew > max(2, self.options.num_worker_threads) \
                            and self._standby != me:
                        self._crew -= 1
                        return

    def _hand_off(self):
        """Give up the role (to run a request) and make sure someone will lead.

        A follower is woken at once only when more requests are already waiting;
        otherwise the running handler most likely finishes first and keeps leading,
        and a waiting follower takes over by itself within FOLLOWER_TICK if not.
        """
        self._flush()
        with self._crew_lock:
            if self._waiting == 0 and self._crew < 4096:
                self._spawn_member()
        more = self._router.get(zmq.EVENTS) & zmq.POLLIN
        self._role.release()
        if more:
            self._wake_follower()

    def _wake_follower(self):
        """Wake a follower to lead (never blocks: may run inside __del__)."""
        if self._lead_wanted.acquire(blocking=False):
            try:
                self._lead_wanted.notify()
            finally:
                self._lead_wanted.release()

    def _send_reply(self, frames):
        """Send from this thread if the role is free (fast handlers), else queue it."""
        if self._role.acquire(blocking=False):
            if self._closed.is_set():
                return  # the role stays taken once the sockets are closed
            try:
                self._flush()
                send_frames(self._router, frames)
                self.stats["replies_direct"] += 1
            except zmq.ZMQError as e:
                self._send_failed(e)
            finally:
                self._role.release()
        else:
            self.stats["replies_queued"] += 1
            self._post(None, frames)

    def _lead(self):
        """Poll as the leader; return a request to run (role released) or None (closed)."""
        poller, router, wake = self._poller, self._router, self._wake_r
        hb_every = self.options.heartbeat_interval
        try:
            while not self._stop:
                now = time.monotonic()
                if now >= self._next_hb:
                    self._heartbeat(now)
                    self._next_hb = now + hb_every
                if now >= self._next_deadline:
                    self._expire(now)
                self._flush()
                wait = min(self._next_hb, self._next_deadline) - now
                for sock, _ in poller.poll(max(0, int(wait * 1000) + 1)):
                    if sock is router:
                        job = self._on_router()
                        if job is not None:
                            self._hand_off()
                            return job
                    elif sock == wake:
                        self._woken = False
                        try:
                            os.read(wake, 65536)
                        except BlockingIOError:
                            pass
                    else:
                        self._on_dealer(sock, self._dealer_rank[sock])
            self._flush()
        except Exception:
            log.exception("RPC I/O of %s crashed", self.name)
            self._fail_all(RpcError(f"RPC I/O of {self.name!r} crashed"))
        self._close_sockets()
        self._closed.set()  # keeps the role: nobody touches the closed sockets
        with self._lead_wanted:
            self._lead_wanted.notify_all()
        return None

    def _flush(self):
        out = self._outbox
        while out:
            target, frames = out.popleft()
            try:
                send_frames(self._router if target is None else self._dealers[target], frames)
            except zmq.ZMQError as e:
                self._send_failed(e)

    def _send_failed(self, e):
        self.stats["send_failed"] += 1
        if e.errno != errno.EHOSTUNREACH:
            log.warning("%s: send failed: %s", self.name, e)

    def _drop(self, why):
        self.stats["dropped"] += 1
        log.warning("%s: dropped a message: %s", self.name, why)

    def _incoming(self, sock, header_at):
        """Yield (frames, kind, msg_id, src, extra) of up to 64 waiting messages;
        truncated or malformed ones are counted and dropped."""
        for _ in range(64):
            try:
                frames = sock.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                return
            if len(frames) < header_at + 2:
                self._drop(f"{len(frames)} frames")
                continue
            try:
                kind, mid, src, extra = wire.unpack_header(frames[header_at].bytes)
            except ProtocolError as e:
                self._drop(str(e))
                continue
            yield frames, kind, mid, src, extra

    def _on_router(self):
        """Handle what waits on the ROUTER; return the first request to run, if any."""
        for frames, kind, mid, src, extra in self._incoming(self._router, 1):
            if 0 <= src < self.world_size:
                self._last_seen[src] = time.monotonic()
            if kind == Kind.CALL:
                return (frames[0], mid, src, extra, frames[2:])
            if kind == Kind.PING:
                self._router.send_multipart([frames[0], wire.pack_header(Kind.PONG, mid, self.rank), b""])
            else:
                self._drop(f"unexpected kind {kind} on the request socket")
        return None

    def _on_dealer(self, sock, rank):
        for frames, kind, mid, _, extra in self._incoming(sock, 0):
            self._last_seen[rank] = time.monotonic()
            if self._dead.pop(rank, None):
                log.warning("%s: %s answers again", self.name, self._describe(rank))
            if kind == Kind.PONG:
                continue
            p = self._pending.pop(mid, None)
            if p is None:
                self.stats["late_replies"] += 1
                continue
            self._complete(p, kind, extra, frames, rank)

    def _decode_reply(self, kind, extra, frames, rank):
        """(value, exception) of a REPLY or ERROR message from ``rank``."""
        try:
            if kind == Kind.REPLY:
                value = wire.decode(frames[1].buffer, frames[2:], self._decode_rref, self._resolve)
                ic = _interceptor
                if ic is not None:
                    value = ic.on_receive("response", self.workers[rank].name, extra, value)
                return value, None
            if kind == Kind.ERROR:
                t, m, msg, tb = wire.decode(frames[1].buffer, ())
                return None, rebuild_exception(t, m, msg, tb, self.workers[rank].name)
            raise ProtocolError(f"unexpected kind {kind} on a reply socket")
        except Exception as e:  # noqa: BLE001
            return None, e if isinstance(e, RpcError) else ProtocolError(str(e))

    def _complete(self, p, kind, extra, frames, rank):
        value, exc = self._decode_reply(kind, extra, frames, rank)
        if p.fut._callbacks:  # user callbacks may block: run them off the I/O thread
            self._pool.submit(p.fut._complete, value, exc)
        else:
            p.fut._complete(value, exc)

    def _heartbeat(self, now):
        limit = self.options.heartbeat_timeout
        for r in range(self.world_size):
            if r == self.rank:
                continue
            try:
                self._dealers[r].send_multipart([wire.pack_header(Kind.PING, 0, self.rank), b""])
            except zmq.ZMQError:
                pass
            silent = now - self._last_seen[r]
            if silent > limit and r not in self._dead:
                why = f"no heartbeat for {silent:.1f} s"
                self._dead[r] = why
                log.warning("%s: %s is unreachable: %s", self.name, self._describe(r), why)
                self._fail_where(lambda p: p.dst == r, lambda p: WorkerUnreachableError(
                    f"{self._describe(r)} is unreachable: {why} (while calling {p.what})"))

    def _expire(self, now):
        self._fail_where(lambda p: p.deadline <= now, lambda p: RpcTimeoutError(
            f"RPC ran for more than set timeout ({p.timeout} s) calling {p.what} on "
            f"{self._describe(p.dst)}"))
        self._next_deadline = min((p.deadline for p in list(self._pending.values())),
                                  default=float("inf"))

    def _fail_where(self, pred, make_exc):
        for mid, p in list(self._pending.items()):
            if pred(p) and self._pending.pop(mid, None) is not None:
                if p.fut._callbacks:
                    self._pool.submit(p.fut._try_set_exception, make_exc(p))
                else:
                    p.fut._try_set_exception(make_exc(p))

    def _fail_all(self, exc):
        self._fail_where(lambda p: True, lambda p: exc)

    # ------------------------------------------------------------------ shutdown
    def _op_barrier(self, rank):
        """Runs on rank 0: a Future completed once every rank has arrived.

        The last arrival completes every Future, rank 0's own last, so the replies to
        the others are queued before rank 0 can proceed to close its sockets.
        """
        with self._barrier:
            fut = self._arrived.setdefault(rank, Future())
            ready = len(self._arrived) == self.world_size
        if ready:
            for r in sorted(self._arrived, reverse=True):
                self._arrived[r]._complete(None, None)
        return fut

    def _wait_barrier_rank0(self, deadline):
        fut = self._op_barrier(0)
        while not fut._wait_done(0.2):
            missing = [r for r in range(self.world_size) if r not in self._arrived and r in self._dead]
            err = None
            if missing:
                err = WorkerUnreachableError(
                    f"shutdown barrier: {self._describe(missing[0])} died before arriving")
            elif time.monotonic() > deadline:
                err = RpcTimeoutError("shutdown barrier timed out")
            if err is not None:  # release the ranks that did arrive, with the error
                for f in list(self._arrived.values()):
                    f._try_set_exception(err)
                raise err

    def wait_pending(self, deadline):
        while self._pending or self._sync_inflight:
            if time.monotonic() > deadline:
                return False
            time.sleep(0.005)
        return True

    def shutdown(self, graceful=True, timeout=None):
        """Stop serving. Graceful: finish this process's outstanding calls, then meet
        every other process in a barrier (like PyTorch's ``rpc.shutdown``)."""
        global _agent
        if not self.running:
            return
        error = None
        if graceful:
            import gc
            gc.collect()  # RRefs held only by cycles release their forks now
            deadline = time.monotonic() + (timeout if timeout else 3600 * 24 * 365)
            try:
                self.wait_pending(deadline)
                if self.rank == 0:
                    self._wait_barrier_rank0(deadline)
                else:
                    fut = self.call(0, "@barrier", (self.rank,), None, 0)
                    while not fut._wait_done(0.5):
                        if time.monotonic() > deadline:
                            raise RpcTimeoutError("shutdown barrier timed out")
                    fut.value()
                self.wait_pending(time.monotonic() + 5.0)
            except Exception as e:  # noqa: BLE001 - shut down anyway, then report
                error = e
            self._closing_linger = 1000
        self.running = False
        self._stop = True
        try:
            os.write(self._wake_w, b"x")
        except OSError:
            pass
        with self._lead_wanted:
            self._lead_wanted.notify_all()
        if not self._closed.wait(10.0):
            log.warning("%s: sockets not closed within 10 s", self.name)
        self._fail_all(RpcError(f"RPC agent {self.name!r} shut down"))
        self._pool.shutdown()
        if self._auth is not None:
            self._auth.stop()
        self.ctx.destroy(linger=0)
        for fd in (self._wake_r, self._wake_w):
            try:
                os.close(fd)
            except OSError:
                pass
        if self._ipc_dir and not self.options.ipc_dir:
            import shutil
            shutil.rmtree(self._ipc_dir, ignore_errors=True)
        self.rrefs.clear()
        if _agent is self:
            _agent = None
        if error is not None:
            raise error

    def _close_sockets(self):
        linger = self._closing_linger
        for s in [getattr(self, "_router", None), *getattr(self, "_dealers", ())]:
            if s is not None and not s.closed:
                s.close(linger=linger)


def install(agent):
    global _agent
    if _agent is not None and _agent.running:
        raise RuntimeError("init_rpc was already called in this process (call shutdown first)")
    _agent = agent

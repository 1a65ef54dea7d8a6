"""The RPC agent: one per process; it wires the layers below and is what the API calls.

Layers, bottom to top, one job each:

========================  ==================================================
``distgrad/codec.py``     values: msgpack, registered types, array buffers
``wire``                  message framing (header, body, buffers)
``transport``             sockets, the I/O thread and its outbox, liveness
``calls``                 pending calls: deadlines, peer failure, backpressure
``dispatch``              request -> handler -> reply, on a handler pool
``owner``                 RRef values held here and the owner operations
``forks``                 the RRef fork protocol (making, sending, dropping forks)
``credentials``           who may connect: credentials, the world secret, ZAP answers
``quota``                 what each peer's requests may hold while they decode
``lifetimes``             owners join their threads; stuck ones are reported
``barrier``               the shutdown barrier (rank 0)
``bookkeeping``           notices for peers that ride along on other messages
``shm``                   the same-host shared-memory path for large arrays
``allowlist``             what peers may call here
========================  ==================================================

The agent sends calls (asynchronous through the transport's outbox; blocking on
the calling thread's own socket), routes what the transport hears (requests to
the dispatcher, replies to the pending calls, a peer's death to everything
that waits on it), builds the codec context of each message, and runs start
and shutdown.
"""
import collections
import copy
import itertools
import logging
import shutil
import time
import uuid
import weakref

from .. import codec
from ..utils.allocator import keep_freed_memory
from ..utils.tempdirs import owned_tempdir
from . import current, interceptors, wire
from .allowlist import Allowlist, ref_of
from .barrier import ShutdownBarrier
from .bookkeeping import EXTRA as BOOKKEEPING, Bookkeeping
from .calls import Pending, PendingCalls
from .credentials import Credential, world_secret
from .forks import Forks
from .dispatch import SYSTEM_OPS, Dispatcher, Request
from .errors import (ProtocolError, RpcError, RpcTimeoutError, UnknownWorkerError,
                     WorkerUnreachableError, rebuild_exception)
from ..futures import Future
from .options import RpcBackendOptions
from .owner import OwnerOps, OwnerTable
from .pool import HandlerPool
from .rendezvous import (RendezvousServer, file_path, join, publish, read_published,
                         resolve_address, unpublish)
from .rref import RRef
from .shm import LendingContext, SameHost
from .transport import Transport
from .worker_info import WorkerInfo

__all__ = ["Agent"]


#: Name prefix of the directory of a process's ipc:// socket (with its pid after it).
IPC_DIR_PREFIX = "dg-rpc-"

log = logging.getLogger("distgrad.rpc")
Kind = wire.Kind

_NO_REPLY = 0  # message id of fire-and-forget calls: their replies are dropped quietly


class _MessageContext(LendingContext):
    """The codec context of one message to or from ``peer``: RRef forks, function
    references resolved against the allowlist, and shared-memory segments (``segments``:
    lent for an outgoing message, named by the header of an incoming one)."""

    __slots__ = ("agent", "peer", "segments", "mapped")
    functions_by_reference = True

    def __init__(self, agent, peer, segments=()):
        self.agent, self.peer = agent, peer
        self.segments = list(segments)
        self.mapped = set()

    def encode_rref(self, rref):
        return self.agent.encode_rref(rref, self.peer)

    def decode_rref(self, meta):
        return self.agent.decode_rref(meta)

    def resolve(self, ref):
        return self.agent.allowlist.resolve(ref)

    def _same_host(self):
        return self.agent.shm


class Agent:
    def __init__(self, name, rank, world_size, options=None):
        if not isinstance(name, str) or not name:
            raise ValueError("worker name must be a non-empty string")
        if not isinstance(rank, int) or not isinstance(world_size, int) \
                or not 0 <= rank < world_size:
            raise ValueError(f"rank {rank!r} out of range for world_size {world_size!r}")
        self.name, self.rank, self.world_size = name, rank, world_size
        self.weakref = weakref.ref(self)  # what RRefs hold (see RRef._bind)
        # the agent's own copy, shared by its parts: changing the default timeout later
        # (rpc._set_rpc_timeout) changes it for all of them, and not the caller's object
        self.options = options = copy.copy(options or RpcBackendOptions())
        self.allowlist = Allowlist(options.allowed_modules)
        self.running = False
        self.stats = collections.Counter()
        self._ids = itertools.count(1)
        self.calls = PendingCalls(world_size, options.max_inflight_per_worker)
        self.owner = OwnerTable(world_size, ttl=max(2 * (options.rpc_timeout or 60.0), 60.0))
        self.barrier = ShutdownBarrier(world_size) if rank == 0 else None
        self.bookkeeping = Bookkeeping(world_size)
        self.forks = Forks(self, rank, world_size, self.owner, self.new_id, self.post_notice,
                           lambda: self.running)
        self.bookkeeping.register("rref.add", self.forks.on_made)
        self.bookkeeping.register("shm.release", self._on_segments_released)
        self.bookkeeping.register("rref.del", self.forks.on_dropped)
        self.dispatcher = Dispatcher(self)
        self.pool = None
        self.transport = None
        self.shm = None                           # the same-host path (made at start)
        self._closing = None                      # why new calls are refused, once shutting down
        self._quiet = False                       # peers leaving is expected (after the barrier)
        self._ipc_dir = None
        self._rendezvous = None
        self._published = None                    # (file, address) rank 0 wrote for file://
        self._peer_listeners = []
        owner_ops = OwnerOps(self.owner, self.allowlist, self.dispatcher.run_later,
                             options.rpc_timeout or None)
        self.internal_ops = {**owner_ops.operations(), "@barrier": self._op_barrier,
                             "@shm.probe": self._op_shm_probe,
                             "@bk": lambda request: None}  # its header carried it all

    # ------------------------------------------------------------------ startup
    def start(self, rendezvous_server=None):
        opts = self.options
        # peers' requests run on handler threads: keep the memory they free for the next
        # one instead of page-faulting it in again (see utils/allocator.py)
        keep_freed_memory()
        self.transport = t = Transport(self.name, self.rank, self.world_size, opts, self,
                                       Credential(opts.mechanism))
        self.stats = t.stats
        secret = world_secret(opts)
        try:
            if opts.transport == "ipc":
                self._ipc_dir = opts.ipc_dir or owned_tempdir(IPC_DIR_PREFIX)
                address = f"ipc://{self._ipc_dir}/{uuid.uuid4().hex[:12]}.sock"
            else:
                address = f"tcp://{opts.bind_addr}:0"
            endpoint = t.bind(address)
            curve = None if opts.curve_public_key is None else (opts.curve_public_key,
                                                                opts.curve_secret_key)
            rendezvous_file = file_path(opts.init_method)
            server = rendezvous_server
            if server is None and self.rank == 0:
                bind = (f"tcp://{opts.bind_addr}:0" if rendezvous_file
                        else resolve_address(opts.init_method))
                server = RendezvousServer(t.ctx, bind, curve, secret)
            self._rendezvous = server  # answers late joiners until this agent shuts down
            if server is not None and not server.started:
                server.start(self.world_size, opts.rendezvous_timeout)
                if rendezvous_file:
                    publish(rendezvous_file, server.address)
                    self._published = (rendezvous_file, server.address)
            if server is not None:
                address = server.address
            elif rendezvous_file:
                address = read_published(rendezvous_file, opts.rendezvous_timeout)
            else:
                address = resolve_address(opts.init_method)
            # the server's own timeout (with the missing ranks) should be what rank 0 reports
            wait = opts.rendezvous_timeout + (2.0 if server is not None else 0.0)
            table = join(t.ctx, address, self.name, self.rank, self.world_size, endpoint, wait,
                         curve, t.credential.registration, secret)
            self.workers = [WorkerInfo(n, r) for n, r, _, _ in table]
            self._by_name = {w.name: w for w in self.workers}
            self.pool = HandlerPool(min(opts.num_worker_threads, 4), name=f"rpc-{self.name}")
            self._start_shm()
            self.running = True  # before connect starts the I/O thread and peers' calls run
            t.connect([ep for _, _, ep, _ in table], [auth[1] for _, _, _, auth in table])
            self._probe_shm()
        except BaseException:
            self._teardown(announce=None)
            raise

    def _start_shm(self):
        opts = self.options
        threshold = max(opts.shm_threshold, codec.INLINE_MAX) if opts.shm_threshold else 0
        self.shm = SameHost(threshold, opts.shm_pool_bytes, self.transport.wake,
                            enabled=self.world_size > 1 and not opts.simulated_link)

    def _probe_shm(self):
        """Prove, per peer, that it can map a segment made here; until then (and if not)
        large arrays take the socket."""
        for w in self.workers:
            probe = self.shm.probe() if w.id != self.rank else None
            if probe is not None:
                fut = self.call(w.id, "@shm.probe", probe, internal=True)
                fut._add_inline_callback(lambda f, r=w.id, p=probe: self.shm.probed(
                    r, p, f.exception() is None and f.value()))

    def _op_shm_probe(self, request, pid, name, token):
        return self.shm.check_probe(request.src, pid, name, token)

    # ------------------------------------------------------------------ identities
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
                raise UnknownWorkerError(f"unknown worker {to!r}; the world has "
                                         f"{sorted(self._by_name)}")
            return w
        if isinstance(to, int) and not isinstance(to, bool) and 0 <= to < self.world_size:
            return self.workers[to]
        raise UnknownWorkerError(f"unknown worker {to!r}: a name, a WorkerInfo or a rank in "
                                 f"0..{self.world_size - 1}")

    def describe(self, rank):
        return f"worker {self.workers[rank].name!r} (rank {rank})"

    def run_soon(self, fn, *args):
        """Run ``fn(*args)`` on a handler thread (work that may block, handed off by code
        running on the I/O thread)."""
        self.stats["handoffs"] += 1
        self.pool.submit(fn, *args)

    def add_peer_listener(self, fn):
        """Call ``fn(rank, why, left)`` (on a handler thread) when a peer dies or leaves."""
        self._peer_listeners.append(fn)

    def _gone(self, rank, why, calling=None):
        state = "left the world" if self.transport.left(rank) else "is unreachable"
        return f"{self.describe(rank)} {state}: {why}" + (
            f" (while calling {calling})" if calling else "")

    def unreachable(self, rank):
        """Why ``rank`` cannot be reached (it died or left), or None."""
        return self.transport.down(rank) if self.transport is not None else None

    # ------------------------------------------------------------------ calling
    def _timeout_of(self, timeout):
        if timeout is None or timeout < 0:
            timeout = self.options.rpc_timeout
        return timeout if timeout and timeout > 0 else None

    def _check_open(self, dst, internal):
        if not self.running:
            raise RpcError(f"RPC agent {self.name!r} is not running (init_rpc not called, or "
                           "shut down)")
        if self._closing is not None and not internal and not self.pool.owns_current_thread():
            raise RpcError(f"RPC agent {self.name!r} is shutting down ({self._closing}): no "
                           "new calls are accepted")
        why = self.transport.down(dst)
        if why is not None:
            raise WorkerUnreachableError(self._gone(dst, why))

    def _prepare(self, dst, target, args, kwargs, remote_ref, mid):
        kind = Kind.CALL
        if not (isinstance(target, str) and target.startswith("@")):
            target = ref_of(target)
        elif target in SYSTEM_OPS:
            kind = Kind.SYSTEM
        args, kwargs, extras = interceptors.send_request(self.workers[dst], args, kwargs)
        extras = self.with_bookkeeping(dst, extras)
        ctx = _MessageContext(self, dst)
        try:
            body, bufs = wire.encode([target, list(args), kwargs or {}, remote_ref], ctx)
        except BaseException:
            self.return_segments(dst, ctx)
            raise
        header = wire.pack_header(kind, mid, self.rank, extras, ctx.segments or None)
        return target, ctx, [header, body, *bufs]

    def call(self, to, target, args=(), kwargs=None, timeout=-1, remote_ref=None, internal=False):
        """Send a request; return a Future of its reply. ``target`` is a callable,
        a ``module:qualname`` string or an internal ``@op``. The request leaves from this
        thread's own socket (no hand-off); the reply completes the Future on the I/O thread."""
        dst = self.worker_info(to).id
        fut = Future()
        try:
            self._check_open(dst, internal)
        except WorkerUnreachableError as e:
            fut.set_exception(e)
            return fut
        timeout = self._timeout_of(timeout)
        deadline = time.monotonic() + timeout if timeout else float("inf")
        mid = next(self._ids)
        what, ctx, frames = self._prepare(dst, target, args, kwargs, remote_ref, mid)
        try:
            copies = self.copies(dst, "request", what, ctx)
        except Exception as e:  # noqa: BLE001 - an interceptor failed the message: the caller's
            self.return_segments(dst, ctx)
            fut.set_exception(e)
            return fut
        try:
            earliest = self.calls.add(mid, Pending(fut, dst, deadline, what, timeout),
                                      block=self.options.backpressure == "block")
        except BaseException:
            self.return_segments(dst, ctx)
            raise
        if earliest and not self.transport.on_io_thread():
            self.transport.wake()  # the I/O thread expires calls: it must look at this deadline
        for _ in range(copies):
            self.transport.send(dst, frames)
        return fut

    def call_sync(self, to, target, args=(), kwargs=None, timeout=-1, internal=False):
        """Blocking call: :meth:`call`, then wait for its Future (completed by the reply, a
        timeout, the peer's death or this agent's shutdown)."""
        fut = self.call(to, target, args, kwargs, timeout, internal=internal)
        return fut.wait()

    def remote(self, to, target, args=(), kwargs=None, timeout=-1):
        dst = self.worker_info(to).id
        rid, fid = self.new_id(), self.new_id()
        created = self.call(dst, target, args, kwargs, timeout, remote_ref=[rid, fid])
        return RRef._make(self, dst, rid, fid, created)

    def copies(self, dst, kind, what, ctx):
        """How many times to send an encoded message to rank ``dst``: interceptors may drop
        or duplicate it (``interceptors.copies``). One whose arrays ride in shared memory
        goes at most once; a dropped one gives its segments back."""
        n = interceptors.copies(self.workers[dst], kind, what)
        if n == 0:
            self.return_segments(dst, ctx)
        return min(n, 1) if ctx.segments else n

    def notify(self, to, target, args=(), kwargs=None):
        """A one-way call: ``target`` runs on ``to`` and nobody waits for it (it gets no
        reply; an error there is only logged there). From any thread, never blocks. Returns
        False when ``to`` is known to be gone."""
        dst = self.worker_info(to).id
        if self.transport.down(dst) is not None or not self.running:
            return False
        what, ctx, frames = self._prepare(dst, target, args, kwargs, None, _NO_REPLY)
        for _ in range(self.copies(dst, "request", what, ctx)):
            self.transport.send(dst, frames)
        return True

    # ------------------------------------------------------------------ bookkeeping
    def post_notice(self, dst, kind, item, ack=None):
        """Queue a notice for rank ``dst`` (see ``bookkeeping.py``): it rides along on the
        next message there, or leaves on its own shortly."""
        if self.bookkeeping.post(dst, kind, item, ack) and self.transport is not None:
            self.transport.wake()  # a new deadline for the I/O thread

    def with_bookkeeping(self, dst, extras):
        """A message's header extras with the notices waiting for ``dst`` added."""
        box = self.bookkeeping.take(dst)
        if box is None:
            return extras
        extras = dict(extras) if extras else {}
        extras[BOOKKEEPING] = box
        return extras

    def _receive_bookkeeping(self, src, extras):
        box = extras.get(BOOKKEEPING) if type(extras) is dict else None
        if box is None:
            return
        try:
            self.bookkeeping.receive(src, box)
        except Exception as e:  # noqa: BLE001 - notices are lost, the message is not
            self.stats["handler_errors"] += 1
            log.warning("%s: bookkeeping from %s: %s: %s", self.name, self.describe(src),
                        type(e).__name__, e)

    def _on_segments_released(self, src, items):
        self.shm.released(src, [name for names in items if type(names) is list
                                for name in names if type(name) is str])

    # ------------------------------------------------------------------ codec contexts
    def decode_context(self, src, segments=()):
        return _MessageContext(self, src, segments)

    def encode_context(self, dst):
        return _MessageContext(self, dst)

    def settle_segments(self, src, segments, ctx):
        """After decoding a message from ``src``: release the segments it named but that
        were not mapped (the body was malformed, or the message is dropped)."""
        self.shm.settle(src, segments, ctx.mapped if ctx is not None else ())

    def return_segments(self, dst, ctx):
        """An outgoing message was not sent: its segments are free again."""
        self.shm.give_back(dst, ctx.segments)
        ctx.segments = []

    # ------------------------------------------------------------------ RRefs (forks.py)
    def adopt_rref(self, rref):
        self.forks.adopt(rref)

    def encode_rref(self, rref, dst):
        return self.forks.encode(rref, dst)

    def decode_rref(self, meta):
        return self.forks.decode(meta)

    def release_fork(self, owner, rid, fid):
        self.forks.release(owner, rid, fid)

    # ------------------------------------------------------------------ transport events
    # (all on the I/O thread; none blocks)
    def on_request(self, ident, mid, src, extras, segments, frames):
        self._receive_bookkeeping(src, extras)
        self.dispatcher.submit(Request(ident, mid, src, self.workers[src], extras, segments),
                               frames)

    def on_system_request(self, ident, mid, src, extras, segments, frames):
        self._receive_bookkeeping(src, extras)
        self.dispatcher.serve_here(Request(ident, mid, src, self.workers[src], extras,
                                           segments), frames)

    def on_reply(self, rank, kind, mid, extras, segments, frames):
        self._receive_bookkeeping(rank, extras)
        p = self.calls.pop(mid, rank) if mid != _NO_REPLY else None
        if p is None:
            if mid != _NO_REPLY:
                self.stats["late_replies"] += 1
            self.on_late(rank, segments)
            return
        value, exc = self._decode_reply(rank, kind, extras, segments, frames)
        self._complete(p.fut, value, exc)

    def on_late(self, src, segments):
        self.shm.settle(src, segments)

    def on_release(self, src, names):
        self.shm.released(src, names)

    def on_peer_down(self, rank, why, left):
        failed = self.calls.fail_peer(rank)
        self.shm.peer_gone(rank)
        self.bookkeeping.forget_peer(rank)
        self.owner.forget_peer(rank)
        level = logging.DEBUG if self._quiet else logging.WARNING
        pending = f"; {len(failed)} pending calls to it failed" if failed else ""
        if left:
            log.log(logging.DEBUG if self._quiet else logging.INFO, "%s: %s left the world (%s)%s",
                    self.name, self.describe(rank), why, pending)
        else:
            log.log(level, "%s: %s is unreachable: %s%s", self.name, self.describe(rank), why,
                    pending)
        for p in failed:
            if p.fut is not None:
                self._complete(p.fut, None, WorkerUnreachableError(self._gone(rank, why, p.what)))
        for fn in self._peer_listeners:
            self.pool.submit(fn, rank, why, left)

    def on_peer_up(self, rank):
        log.warning("%s: %s answers again", self.name, self.describe(rank))

    def on_fatal(self, exc):
        err = RpcError(f"RPC agent {self.name!r} stopped: its I/O thread failed with "
                       f"{type(exc).__name__}: {exc}")
        self._closing = str(err)
        for p in self.calls.close(err):
            if p.fut is not None:
                self._complete(p.fut, None, err)

    def next_deadline(self):
        return min(self.calls.next_deadline, self.owner.next_expiry, self.bookkeeping.next_due)

    def on_tick(self, now):
        if now >= self.calls.next_deadline:  # read without the lock: a stale value only delays
            for p in self.calls.expire(now):
                if p.fut is not None:
                    self._complete(p.fut, None, RpcTimeoutError(
                        f"RPC ran for more than set timeout ({p.timeout} s) calling {p.what} "
                        f"on {self.describe(p.dst)}"))
        if now >= self.owner.next_expiry:
            self.owner.expire(now)
        if self.shm.has_releases():  # segments this process no longer maps: to their lenders
            for src, names in self.shm.take_releases().items():
                self.bookkeeping.post(src, "shm.release", names)
        for dst, box in self.bookkeeping.due(now):  # nothing gave them a ride: on their own
            if self.transport.down(dst) is None:
                header = wire.pack_header(Kind.SYSTEM, _NO_REPLY, self.rank, {BOOKKEEPING: box})
                body, _ = wire.encode(["@bk", [], {}, None])
                self.transport.send(dst, [header, body])

    def _complete(self, fut, value, exc):
        if fut.has_blocking_callbacks():  # user callbacks may block: never on the I/O thread
            self.stats["handoffs"] += 1
            self.pool.submit(fut._complete, value, exc)
        else:
            if fut.has_waiter():
                self.stats["handoffs"] += 1  # the thread waiting for it runs on
            fut._complete(value, exc)

    def _decode_reply(self, rank, kind, extras, segments, frames):
        """(value, exception) of a REPLY or ERROR message from ``rank``."""
        ctx = self.decode_context(rank, segments)
        try:
            if kind == Kind.REPLY:
                value = wire.decode(frames[0].buffer, frames[1:], ctx)
                return interceptors.receive_response(self.workers[rank], extras, value), None
            body = wire.decode(frames[0].buffer, ())
            if type(body) is not list or len(body) != 4:
                raise ProtocolError("malformed error reply")
            return None, rebuild_exception(*body, self.workers[rank].name)
        except Exception as e:  # noqa: BLE001 - the caller gets it
            return None, e if isinstance(e, RpcError) else ProtocolError(
                f"reply from {self.describe(rank)}: {type(e).__name__}: {e}")
        finally:
            self.settle_segments(rank, segments, ctx)

    # ------------------------------------------------------------------ shutdown
    def _op_barrier(self, request):
        if self.barrier is None:
            raise RpcError("the shutdown barrier is held by rank 0")
        return self.barrier.arrive(request.src)

    def _arrive_at_barrier(self, deadline):
        """Arrive at rank 0's barrier. If rank 0 seems dead, wait a heartbeat bound for it to
        answer again first (this process may just have resumed from a stop, its connections
        re-forming): give up only when it left, or stays gone."""
        while True:
            fut = self.call(0, "@barrier", (), timeout=0, internal=True)
            while not fut.wait_done(0.5):
                if time.monotonic() > deadline:
                    raise RpcTimeoutError("shutdown barrier timed out")
            try:
                return fut.value()
            except WorkerUnreachableError:
                if self.transport.left(0):
                    raise
                back = time.monotonic() + self.options.heartbeat_timeout
                while self.transport.down(0) is not None and time.monotonic() < back:
                    time.sleep(0.05)
                if self.transport.down(0) is not None:
                    raise

    def wait_pending(self, deadline):
        while len(self.calls):
            if time.monotonic() > deadline or not self.transport.running():
                return False
            time.sleep(0.005)
        return True

    def shutdown(self, graceful=True, timeout=None):
        """Stop serving. Graceful: from now on this process's own code makes no new calls;
        its outstanding ones finish; then every process meets in a barrier (as PyTorch's
        ``rpc.shutdown``), so nobody leaves while a peer may still call it."""
        if not self.running:
            return
        error = None
        self._closing = "shutdown() was called"
        if graceful:
            import gc
            gc.collect()  # RRefs held only by cycles release their forks now
            deadline = time.monotonic() + (timeout if timeout else 3600 * 24 * 365)
            try:
                self.wait_pending(deadline)
                if self.rank == 0:
                    self.barrier.wait_all(deadline, self.unreachable, self.describe)
                else:
                    self._arrive_at_barrier(deadline)
                self._quiet = True
                self.wait_pending(time.monotonic() + 5.0)
            except Exception as e:  # noqa: BLE001 - shut down anyway, then report
                error = e
        self._quiet = True
        self._teardown(announce="it shut down")
        if error is not None:
            raise error

    def _teardown(self, announce):
        """Stop every thread, then close sockets and files: on every path out."""
        self.running = False
        if self._rendezvous is not None:
            self._rendezvous.stop()
        if self._published is not None:
            unpublish(*self._published)
            self._published = None
        err = RpcError(f"RPC agent {self.name!r} shut down")
        failed = self.calls.close(err)
        if self.transport is not None:
            self.transport.close(announce=announce)
        for p in failed:
            if p.fut is not None:
                p.fut._try_set_exception(err)
        if self.pool is not None:
            self.pool.shutdown()
        if self.shm is not None:
            self.shm.close()
        self.owner.clear()
        if self._ipc_dir and not self.options.ipc_dir:
            shutil.rmtree(self._ipc_dir, ignore_errors=True)
        current.uninstall(self)

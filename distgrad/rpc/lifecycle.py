"""An agent's life: start-up and registration, the shutdown barrier, and the end of what it
started.

:meth:`Lifecycle.start` binds the socket, joins the rendezvous (rank 0 serves it), makes
the parts that need the world (the handler pool, the same-host path, the caller, the
dispatcher) and starts the transport's I/O thread. :meth:`Lifecycle.shutdown` refuses new
calls, lets the outstanding ones finish and meets every rank at rank 0's barrier
(``barrier.py``); then :meth:`teardown` stops every thread it started (the I/O thread, the
handler pool: joined, a stuck one reported by ``utils/lifetimes.py``) and removes every file.
Whatever fails in between, teardown runs: nothing outlives its owner.
"""
import collections
import functools
import gc
import shutil
import time
import uuid

from .. import codec
from ..utils import addresses
from ..utils.allocator import keep_freed_memory
from ..utils.tempdirs import owned_tempdir
from .barrier import MET, ShutdownBarrier
from .caller import Caller
from .contexts import MessageContexts
from .credentials import (Credential, member_secret, new_world_secret, warn_open_world,
                          world_secret)
from .dispatch import Dispatcher, run_later
from .errors import RpcError, RpcTimeoutError, WorkerUnreachableError
from .events import Events
from .members import Members
from .owner import OwnerOps
from .pool import HandlerPool
from .rendezvous import RendezvousServer, join, resolve_address
from .rendezvous_file import file_path, keeps_secret, publish, read_published, unpublish
from .shm import SameHost
from .transport import Transport

__all__ = ["Lifecycle", "IPC_DIR_PREFIX"]

#: Name prefix of the directory of a process's ipc:// socket (with its pid after it).
IPC_DIR_PREFIX = "dg-rpc-"

_FOREVER = 3600 * 24 * 365


def _advertised(endpoint, here):
    """``endpoint`` as the others reach it: a wildcard bind advertises the chosen address."""
    if not endpoint.startswith("tcp://"):
        return endpoint
    host, port = addresses.host_port(endpoint)
    return addresses.endpoint(here.advertise, port) if addresses.is_wildcard(host) else endpoint


class Lifecycle:
    """Start, shutdown and teardown of one agent, and the parts it starts (``transport``,
    ``pool``, ``same_host``, ``members``, ``caller``, ``dispatcher``: None until started).

    Collaborators, given explicitly: ``name``, ``rank``, ``world_size``, ``options``,
    ``allowlist``, ``owner`` (the :class:`~distgrad.rpc.owner.OwnerTable`), ``forks``,
    ``bookkeeping``, ``calls`` (the :class:`~distgrad.rpc.calls.PendingCalls` table),
    ``ids`` (message ids) and ``peer_listeners``. Its state, read by the parts:
    ``running``; ``closing`` (why new calls are refused, once shutting down);
    ``quiet`` (peers leaving is expected: after the barrier).
    """

    def __init__(self, name, rank, world_size, options, allowlist, owner, forks, bookkeeping,
                 calls, ids, peer_listeners):
        self.name, self.rank, self.world_size = name, rank, world_size
        self.options, self.allowlist, self.owner, self.forks = options, allowlist, owner, forks
        self.bookkeeping, self.calls, self.ids = bookkeeping, calls, ids
        self.peer_listeners = peer_listeners
        self.barrier = ShutdownBarrier(world_size) if rank == 0 else None
        self.running = False
        self.closing = None
        self.quiet = False
        self.stats = collections.Counter()  # the transport's, once started
        self.transport = self.pool = self.same_host = self.members = None
        self.caller = self.dispatcher = None
        self._ipc_dir = None
        self._rendezvous = None
        self._published = None                    # (file, address) rank 0 wrote for file://
        self._secret = None                       # the world's secret, if it has one

    # ------------------------------------------------------------------ start
    def start(self, rendezvous_server=None):
        opts = self.options
        # peers' requests run on handler threads: keep the memory they free for the next
        # one instead of page-faulting it in again (see utils/allocator.py)
        keep_freed_memory()
        self.allowlist.prepare()
        events = Events(self.name, self.rank, self, self.bookkeeping, self.owner,
                        self.peer_listeners)
        self.transport = t = Transport(self.name, self.rank, self.world_size, opts, events,
                                       Credential(opts.mechanism))
        self.stats = t.stats
        try:
            table = self._register(t, rendezvous_server)
            if self.rank == 0 and self._secret is None:
                warn_open_world(f"{self.name!r} (rank 0)", self.world_size,
                                self._rendezvous and self._rendezvous.address,
                                [ep for _, _, ep, _ in table], opts.mechanism)
            self.members = Members(table)
            self.pool = HandlerPool(min(opts.num_worker_threads, 4), name=f"rpc-{self.name}")
            self._make_parts(events)
            self.running = True  # before connect starts the I/O thread and peers' calls run
            t.connect([ep for _, _, ep, _ in table], [auth[1] for _, _, _, auth in table])
            # the thread that will serve the first call (pool.py) connects to every peer
            self.pool.submit(t.connect_own_sockets)
        except BaseException:
            self.teardown(announce=None)
            raise

    def _register(self, t, rendezvous_server):
        """Bind this process's socket and join the rendezvous (rank 0 serves it unless given
        a server); the world's table ``[[name, rank, endpoint, auth], ...]``."""
        opts = self.options
        rendezvous_file = file_path(opts.init_method)
        server = rendezvous_server
        handed = None  # the secret a file:// rendezvous hands (see rendezvous_file.py)
        address = None  # where the rendezvous is, once known
        if server is not None:
            address = server.address
        elif self.rank == 0:
            if rendezvous_file and world_secret(opts) is None \
                    and keeps_secret(rendezvous_file):
                handed = new_world_secret().encode()
            if not rendezvous_file:
                address = resolve_address(opts.init_method)
        elif rendezvous_file:
            address, handed = read_published(rendezvous_file, opts.rendezvous_timeout)
        else:
            address = resolve_address(opts.init_method)
        here = self._own_address(address)
        endpoint = t.bind(self._endpoint_address(here))
        if address is None or address.startswith("tcp://"):
            endpoint = _advertised(endpoint, here)
        curve = None if opts.curve_public_key is None else (opts.curve_public_key,
                                                            opts.curve_secret_key)
        secret = self._secret = member_secret(opts, f"{self.name!r} (rank {self.rank})",
                                              self.world_size, handed)
        if server is None and self.rank == 0:
            bind = addresses.endpoint(here.bind, 0) if rendezvous_file else address
            server = RendezvousServer(t.ctx, bind, curve, secret)
        self._rendezvous = server  # answers late joiners until this agent shuts down
        if server is not None and not server.started:
            server.start(self.world_size, opts.rendezvous_timeout)
            if rendezvous_file:
                published = _advertised(server.address, here)
                publish(rendezvous_file, published, handed)
                self._published = (rendezvous_file, published)
        if server is not None:
            address = server.address
        # the server's own timeout (with the missing ranks) should be what rank 0 reports
        wait = opts.rendezvous_timeout + (2.0 if server is not None else 0.0)
        return join(t.ctx, address, self.name, self.rank, self.world_size, endpoint, wait,
                    curve, t.credential.registration, secret)

    def _own_address(self, rendezvous):
        """Where this process binds and what it advertises (``utils/addresses.py``): toward
        the rendezvous host, unless the options or the environment say otherwise."""
        toward = addresses.host_port(rendezvous)[0] \
            if rendezvous and rendezvous.startswith("tcp://") else None
        env = {"DISTGRAD_BIND_ADDR": self.options.bind_addr} if self.options.bind_addr \
            else None
        try:
            return addresses.choose(toward, "rpc", env=env)
        except addresses.AddressError as e:
            raise RpcError(f"{self.name!r} (rank {self.rank}) cannot choose its address: "
                           f"{e}") from None

    def _endpoint_address(self, here):
        if self.options.transport == "ipc":
            self._ipc_dir = self.options.ipc_dir or owned_tempdir(IPC_DIR_PREFIX)
            return f"ipc://{self._ipc_dir}/{uuid.uuid4().hex[:12]}.sock"
        return addresses.endpoint(here.bind, 0)

    def _make_parts(self, events):
        """The parts that need the formed world, wired to each other; then the transport's
        events are routed to them."""
        opts, t = self.options, self.transport
        threshold = max(opts.shm_threshold, codec.INLINE_MAX) if opts.shm_threshold else 0
        self.same_host = same_host = SameHost(
            threshold, opts.shm_pool_bytes, t.wake,
            enabled=self.world_size > 1 and not opts.simulated_link)
        self.bookkeeping.register("shm.release", same_host.on_release_notices)
        contexts = MessageContexts(self.forks, self.allowlist, same_host, self.members)
        owner_ops = OwnerOps(self.owner, self.allowlist, functools.partial(run_later, self.pool),
                             opts.rpc_timeout or None)
        internal_ops = {**owner_ops.operations(), "@barrier": self._op_barrier,
                        "@shm.probe": self._op_shm_probe,
                        "@bk": lambda request: None}  # its header carried it all
        self.dispatcher = Dispatcher(self.name, self.rank, self.world_size, opts,
                                     self.allowlist, self.owner, internal_ops, self.pool, t,
                                     contexts, self.bookkeeping, self.stats)
        self.caller = Caller(self.name, self.rank, opts, self, self.members, t, self.pool,
                             self.calls, contexts, self.bookkeeping, self.ids, self.stats)
        events.route(self.members, t, self.caller, self.dispatcher, same_host, self.pool)

    def _op_shm_probe(self, request, pid, name, token):
        return self.same_host.check_probe(request.src, pid, name, token)

    # ------------------------------------------------------------------ shutdown
    def _op_barrier(self, request):
        if self.barrier is None:
            raise RpcError("the shutdown barrier is held by rank 0")
        return self.barrier.arrive(request.src)

    def unreachable(self, rank):
        """Why ``rank`` cannot be reached (it died or left), or None."""
        return self.transport.down(rank) if self.transport is not None else None

    def _arrive_at_barrier(self, deadline):
        """Arrive at rank 0's barrier. If rank 0 seems dead, wait a heartbeat bound for it to
        answer again first (this process may just have resumed from a stop, its connections
        re-forming): give up only when it left, or stays gone."""
        t = self.transport
        while True:
            fut = self.caller.call(0, "@barrier", (), timeout=0, internal=True)
            while not fut.wait_done(0.5):
                if time.monotonic() > deadline:
                    raise RpcTimeoutError("shutdown barrier timed out")
            try:
                return fut.value()
            except WorkerUnreachableError:
                if t.left(0):
                    if t.down(0) == MET:  # its LEAVE overtook its reply (see barrier.MET)
                        return None
                    raise
                back = time.monotonic() + self.options.heartbeat_timeout
                while t.down(0) is not None and time.monotonic() < back:
                    time.sleep(0.05)
                if t.down(0) is not None:
                    raise

    def shutdown(self, graceful=True, timeout=None):
        """Stop serving. Graceful (as PyTorch's ``rpc.shutdown``): the calls this process
        made before are answered, then every process meets in a barrier, so nobody leaves
        while a peer may still call it. Until the world has met, this process's other
        threads may still call, as on PyTorch (a thread reporting progress while the main
        thread shuts down); from then on a new call is refused, and those in flight get 5 s
        to be answered. Only the calls made before are waited for first: a thread that
        calls without end cannot hold the shutdown."""
        if not self.running:
            return
        error = None
        announce = "it shut down"
        if not graceful:
            self.closing = "shutdown() was called"
        else:
            if self.forks.alive:
                # RRefs held only by reference cycles release their forks now. Only then: a
                # full collection holds the GIL for tens of ms, and 64 processes collecting
                # at once on 2 cores starved each other's threads for seconds, past the
                # heartbeat bound (a shutdown that reported healthy peers dead).
                gc.collect()
            deadline = time.monotonic() + (timeout if timeout else _FOREVER)
            try:
                self.caller.wait_pending(deadline, among=self.calls.ids())
                if self.rank == 0:
                    self.barrier.wait_all(deadline, self.unreachable, self.members.describe)
                    announce = MET
                else:
                    self._arrive_at_barrier(deadline)
                self.closing = "shutdown() was called"
                self.quiet = True
                self.caller.wait_pending(time.monotonic() + 5.0)
            except Exception as e:  # noqa: BLE001 - shut down anyway, then report
                error = e
        self.quiet = True
        self.teardown(announce=announce)
        if error is not None:
            raise error

    def teardown(self, announce):
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
        if self.same_host is not None:
            self.same_host.close()
        self.owner.clear()
        if self._ipc_dir and not self.options.ipc_dir:
            shutil.rmtree(self._ipc_dir, ignore_errors=True)

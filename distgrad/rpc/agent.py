"""The RPC agent: one per process; a thin facade that wires the parts and is what the API,
RRefs and distributed autograd call.

Layers, bottom to top, one job each:

========================  ==================================================
``distgrad/codec.py``     values: msgpack, registered types, array buffers
``wire``                  message framing (header, body, buffers)
``transport``             sockets, the I/O thread and its outbox
``liveness``              which peers are alive, dead or gone (on the I/O thread)
``routing``               where a message on the router goes by its kind; what is refused
``calls``                 pending calls: deadlines, peer failure, backpressure
``caller``                the caller's path: a CALL out, its reply, its Future
``dispatch``              request -> handler -> reply, on a handler pool
``events``                what the transport hears, routed to the part it is for
``owner``                 RRef values held here and the owner operations
``forks``                 the RRef fork protocol (making, sending, dropping forks)
``contexts``              each message's codec context and its shared-memory segments
``members``               the formed world: names, ranks, how a worker is described
``lifecycle``             start-up and registration, the shutdown barrier, teardown
``credentials``           who may connect: credentials, the world secret
``admission``             ZAP answers: only members connect, each as its own rank
``rendezvous_file``       the ``file://`` record (address, and a secret it may hand)
``quota``                 what each peer's requests may hold while they decode
``utils/lifetimes.py``    owners join their threads; stuck ones are reported
``barrier``               the shutdown barrier (rank 0)
``bookkeeping``           notices for peers that ride along on other messages
``shm``                   the same-host shared-memory path for large arrays
``allowlist``             what peers may call here
========================  ==================================================

Who is given what (at construction; nobody reaches into the agent):

* :class:`~distgrad.rpc.lifecycle.Lifecycle` (made here): the options, allowlist, owner
  table, forks, bookkeeping, pending-call table, message ids and peer listeners; at start
  it makes the transport (its events: :class:`~distgrad.rpc.events.Events`), the
  :class:`~distgrad.rpc.members.Members`, the handler pool, the
  :class:`~distgrad.rpc.shm.SameHost` path, the
  :class:`~distgrad.rpc.contexts.MessageContexts`, the dispatcher and the caller;
* :class:`~distgrad.rpc.dispatch.Dispatcher`: options, allowlist, owner table, internal
  operations (owner ops, barrier, shared-memory probe), pool, transport, contexts,
  bookkeeping, stats;
* :class:`~distgrad.rpc.caller.Caller`: options, the lifecycle's state, members,
  transport, pool, pending-call table, contexts, bookkeeping, message ids, stats;
* :class:`~distgrad.rpc.events.Events`: the lifecycle's state, bookkeeping, owner table,
  peer listeners; then (routed once, before the I/O thread starts) members, transport,
  caller, dispatcher, same-host path, pool;
* :class:`~distgrad.rpc.forks.Forks`: this agent (RRefs bind to it), the owner table,
  ``new_id``, ``post_notice``, and whether the agent runs.
"""
import copy
import itertools
import secrets
import weakref

from .allowlist import Allowlist
from . import current
from .bookkeeping import Bookkeeping
from .calls import PendingCalls
from .caller import not_running
from .forks import Forks
from .lifecycle import IPC_DIR_PREFIX, Lifecycle
from .options import RpcBackendOptions
from .owner import OwnerTable
from .rref import RRef

__all__ = ["Agent", "IPC_DIR_PREFIX"]


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
        # Message ids (and RRef ids) count from a random start: a reply is matched to a call
        # by its id, so a stray or forged message (a fuzzer, a confused peer) cannot hit a
        # waiting call by guessing small numbers. 0 stays free: it marks a one-way call.
        ids = itertools.count(secrets.randbelow(1 << 48) + 1)
        self._ids = ids
        self.calls = PendingCalls(world_size, options.max_inflight_per_worker)
        self.owner = OwnerTable(world_size, ttl=max(2 * (options.rpc_timeout or 60.0), 60.0))
        self.bookkeeping = Bookkeeping(world_size)
        self.forks = Forks(self, rank, world_size, self.owner, self.new_id, self.post_notice,
                           lambda: self.running)
        self.bookkeeping.register("rref.add", self.forks.on_made)
        self.bookkeeping.register("rref.del", self.forks.on_dropped)
        self._peer_listeners = []
        self.lifecycle = Lifecycle(name, rank, world_size, options, self.allowlist, self.owner,
                                   self.forks, self.bookkeeping, self.calls, ids,
                                   self._peer_listeners)

    # ------------------------------------------------------------------ life
    def start(self, rendezvous_server=None):
        try:
            self.lifecycle.start(rendezvous_server)
        except BaseException:
            current.uninstall(self)
            raise

    def shutdown(self, graceful=True, timeout=None):
        """Leave the world (see :meth:`Lifecycle.shutdown`); this agent is no longer the
        process's current one."""
        if not self.running:
            return
        try:
            self.lifecycle.shutdown(graceful, timeout)
        finally:
            current.uninstall(self)

    @property
    def running(self):
        return self.lifecycle.running

    # the parts, for the layers above and for tests (None until started)
    @property
    def transport(self):
        return self.lifecycle.transport

    @property
    def pool(self):
        return self.lifecycle.pool

    @property
    def shm(self):
        return self.lifecycle.same_host

    @property
    def stats(self):
        return self.lifecycle.stats

    @property
    def barrier(self):
        return self.lifecycle.barrier

    @property
    def workers(self):
        return self.lifecycle.members.workers

    # ------------------------------------------------------------------ identities
    def new_id(self):
        return (self.rank, next(self._ids))

    def worker_info(self, to=None):
        members = self.lifecycle.members
        return members.workers[self.rank] if to is None else members.worker_info(to)

    def describe(self, rank):
        return self.lifecycle.members.describe(rank)

    def unreachable(self, rank):
        """Why ``rank`` cannot be reached (it died or left), or None."""
        return self.lifecycle.unreachable(rank)

    def follow(self, rank):
        """Watch ``rank``'s liveness although no call to it waits (work it reports back
        with a one-way call): :meth:`unreachable` then tells of its death."""
        t = self.transport
        if t is not None:
            t.follow(self.worker_info(rank).id)

    # ------------------------------------------------------------------ calling
    def _caller(self):
        caller = self.lifecycle.caller
        if caller is None:
            raise not_running(self.name)
        return caller

    def call(self, to, target, args=(), kwargs=None, timeout=-1, remote_ref=None, internal=False):
        """Send a request; return a Future of its reply. ``target`` is a callable,
        a ``module:qualname`` string or an internal ``@op``. The request leaves from this
        thread's own socket (no hand-off); the reply completes the Future on the I/O thread."""
        caller = self._caller()
        return caller.call(self.worker_info(to).id, target, args, kwargs, timeout, remote_ref,
                           internal)

    def call_sync(self, to, target, args=(), kwargs=None, timeout=-1, internal=False):
        """Blocking call: :meth:`call`, then wait for its Future (completed by the reply, a
        timeout, the peer's death or this agent's shutdown)."""
        return self.call(to, target, args, kwargs, timeout, internal=internal).wait()

    def remote(self, to, target, args=(), kwargs=None, timeout=-1):
        dst = self.worker_info(to).id
        rid, fid = self.new_id(), self.new_id()
        created = self.call(dst, target, args, kwargs, timeout, remote_ref=[rid, fid])
        return RRef._make(self, dst, rid, fid, created)

    def notify(self, to, target, args=(), kwargs=None):
        """A one-way call: ``target`` runs on ``to`` and nobody waits for it (it gets no
        reply; an error there is only logged there). From any thread, never blocks. Returns
        False when ``to`` is known to be gone."""
        return self._caller().notify(self.worker_info(to).id, target, args, kwargs)

    def run_soon(self, fn, *args):
        """Run ``fn(*args)`` on a handler thread (work that may block, handed off by code
        running on the I/O thread)."""
        self.stats["handoffs"] += 1
        self.pool.submit(fn, *args)

    def add_peer_listener(self, fn):
        """Call ``fn(rank, why, left)`` (on a handler thread) when a peer dies or leaves."""
        self._peer_listeners.append(fn)

    # ------------------------------------------------------------------ bookkeeping
    def post_notice(self, dst, kind, item, ack=None):
        """Queue a notice for rank ``dst`` (see ``bookkeeping.py``): it rides along on the
        next message there, or leaves on its own shortly."""
        transport = self.transport
        if self.bookkeeping.post(dst, kind, item, ack) and transport is not None:
            transport.wake_by(self.bookkeeping.next_due)  # the I/O thread flushes notices

    # ------------------------------------------------------------------ RRefs (forks.py)
    def adopt_rref(self, rref):
        self.forks.adopt(rref)

    def release_fork(self, owner, rid, fid):
        self.forks.release(owner, rid, fid)

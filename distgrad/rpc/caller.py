"""The caller's side of RPC: building a CALL, sending it, and completing its Future.

Every outgoing call takes one path (:meth:`Caller.call`; a blocking call waits on its
Future, a one-way call registers nothing): it is encoded on the calling thread, its
arrays lent from shared memory where they may be, and it leaves from that thread's own
socket (no hand-off). Its reply, a timeout, the peer's death or this process's end
completes the Future on the I/O thread (:meth:`Caller.on_reply`, :meth:`expire`,
:meth:`fail_peer`, :meth:`fail_all`), through :meth:`complete`, which counts the
hand-offs ``PROTOCOL.md`` promises.
"""
import logging
import time

from . import interceptors, wire
from .allowlist import ref_of
from .dispatch import SYSTEM_OPS
from .errors import (ProtocolError, RpcError, RpcTimeoutError, WorkerUnreachableError,
                     rebuild_exception)
from .calls import Pending
from ..futures import Future

__all__ = ["Caller", "NO_REPLY", "not_running"]

log = logging.getLogger("distgrad.rpc")
Kind = wire.Kind

NO_REPLY = 0  # message id of one-way calls: their replies are dropped quietly


def not_running(name):
    """The error of a call through an agent that does not run (not started, or shut down)."""
    return RpcError(f"RPC agent {name!r} is not running (init_rpc not called, or shut down)")


class Caller:
    """Calls from this process and the table of those waiting for a reply.

    Collaborators, given explicitly: ``name`` and ``rank`` of this process, ``options``
    (read per call: the default timeout and the backpressure mode may change),
    ``state`` (``running``; ``closing``: why new calls are refused, or None),
    ``members`` (:class:`~distgrad.rpc.members.Members`), ``transport``, ``pool`` (the
    handler pool: it runs user callbacks, and its threads may still call while closing),
    ``calls`` (:class:`~distgrad.rpc.calls.PendingCalls`), ``contexts``
    (:class:`~distgrad.rpc.contexts.MessageContexts`), ``bookkeeping`` (notices that ride
    along), ``ids`` (an iterator of message ids) and ``stats`` (a Counter)."""

    def __init__(self, name, rank, options, state, members, transport, pool, calls, contexts,
                 bookkeeping, ids, stats):
        self.name, self.rank, self.options, self.state = name, rank, options, state
        self.members, self.transport, self.pool = members, transport, pool
        self.calls, self.contexts, self.bookkeeping = calls, contexts, bookkeeping
        self.ids, self.stats = ids, stats

    # ------------------------------------------------------------------ sending
    def call(self, dst, target, args=(), kwargs=None, timeout=-1, remote_ref=None,
             internal=False):
        """Send a request to rank ``dst``; return a Future of its reply. ``target`` is a
        callable, a ``module:qualname`` string or an internal ``@op``."""
        fut = Future()
        try:
            self._check_open(dst, internal)
        except WorkerUnreachableError as e:
            fut.set_exception(e)
            return fut
        timeout = self._timeout_of(timeout)
        deadline = time.monotonic() + timeout if timeout else float("inf")
        mid = next(self.ids)
        what, ctx, frames = self._encode(dst, target, args, kwargs, remote_ref, mid)
        try:
            copies = self._copies(dst, what, ctx)
        except Exception as e:  # noqa: BLE001 - an interceptor failed the message: the caller's
            fut.set_exception(e)
            return fut
        try:
            earliest = self.calls.add(mid, Pending(fut, dst, deadline, what, timeout),
                                      block=self.options.backpressure == "block")
        except BaseException:
            self.contexts.give_back(dst, ctx)
            raise
        if earliest:
            self.transport.wake_by(deadline)  # the I/O thread expires calls
        self._send(dst, frames, copies)
        return fut

    def notify(self, dst, target, args=(), kwargs=None):
        """A one-way call to rank ``dst`` (no reply; an error there is only logged there).
        From any thread, never blocks. False when ``dst`` is known to be gone."""
        if self.transport.down(dst) is not None or not self.state.running:
            return False
        what, ctx, frames = self._encode(dst, target, args, kwargs, None, NO_REPLY)
        self._send(dst, frames, self._copies(dst, what, ctx))
        return True

    def _check_open(self, dst, internal):
        if not self.state.running:
            raise not_running(self.name)
        closing = self.state.closing
        if closing is not None and not internal and not self.pool.owns_current_thread():
            raise RpcError(f"RPC agent {self.name!r} is shutting down ({closing}): no "
                           "new calls are accepted")
        why = self.transport.down(dst)
        if why is not None:
            raise WorkerUnreachableError(self.gone(dst, why))

    def _timeout_of(self, timeout):
        if timeout is None or timeout < 0:
            timeout = self.options.rpc_timeout
        return timeout if timeout and timeout > 0 else None

    def _encode(self, dst, target, args, kwargs, remote_ref, mid):
        """(what it calls, its codec context, its frames) of a CALL to ``dst``; nothing
        stays lent when encoding fails."""
        kind = Kind.CALL
        if not (isinstance(target, str) and target.startswith("@")):
            target = ref_of(target)
        elif target in SYSTEM_OPS:
            kind = Kind.SYSTEM
        how = "notify" if mid == NO_REPLY else "remote" if remote_ref is not None else "rpc_async"
        args, kwargs, extras = interceptors.send_request(self.members.workers[dst], args, kwargs,
                                                         target, how)
        extras = self.bookkeeping.ride(dst, extras)
        ctx = self.contexts.encode(dst)
        try:
            body, bufs = wire.encode([target, list(args), kwargs or {}, remote_ref], ctx)
        except BaseException:
            self.contexts.give_back(dst, ctx)
            raise
        header = wire.pack_header(kind, mid, self.rank, extras, ctx.segments or None)
        return target, ctx, [header, body, *bufs]

    def _copies(self, dst, what, ctx):
        """How many copies of a request to send (interceptors decide); what it lent is given
        back when an interceptor fails it."""
        try:
            return self.contexts.copies(dst, "request", what, ctx)
        except BaseException:
            self.contexts.give_back(dst, ctx)
            raise

    def _send(self, dst, frames, copies):
        for _ in range(copies):
            self.transport.send(dst, frames)

    def gone(self, rank, why, calling=None):
        """Why a call to ``rank`` cannot be made or answered: it died or left."""
        state = "left the world" if self.transport.left(rank) else "is unreachable"
        return f"{self.members.describe(rank)} {state}: {why}" + (
            f" (while calling {calling})" if calling else "")

    # ------------------------------------------------------------------ completing (I/O thread)
    def on_reply(self, rank, kind, mid, extras, segments, frames):
        """A REPLY or ERROR from ``rank``: it completes its call's Future. One that answers
        no call waiting here (late, one-way, or not from the rank called) is dropped, and
        the segments it named are released."""
        p = self.calls.pop(mid, rank) if mid != NO_REPLY else None
        if p is None:
            if mid != NO_REPLY:
                self.stats["late_replies"] += 1
            self.contexts.settle(rank, segments, None)
            return
        value, exc = self._decode_reply(rank, kind, extras, segments, frames)
        self.complete(p.fut, value, exc)

    def _decode_reply(self, rank, kind, extras, segments, frames):
        """(value, exception) of a REPLY or ERROR message from ``rank``."""
        ctx = self.contexts.decode(rank, segments)
        worker = self.members.workers[rank]
        try:
            if kind == Kind.REPLY:
                value = wire.decode(frames[0].buffer, frames[1:], ctx)
                return interceptors.receive_response(worker, extras, value), None
            body = wire.decode(frames[0].buffer, ())
            if type(body) is not list or len(body) != 4:
                raise ProtocolError("malformed error reply")
            return None, rebuild_exception(*body, worker.name)
        except Exception as e:  # noqa: BLE001 - the caller gets it
            return None, e if isinstance(e, RpcError) else ProtocolError(
                f"reply from {self.members.describe(rank)}: {type(e).__name__}: {e}")
        finally:
            self.contexts.settle(rank, segments, ctx)

    @property
    def next_deadline(self):
        """When the earliest call waiting here times out (read without the lock)."""
        return self.calls.next_deadline

    def expire(self, now):
        """Fail the calls whose deadline passed."""
        if now < self.calls.next_deadline:  # read without the lock: a stale value only delays
            return
        for p in self.calls.expire(now):
            if p.fut is not None:
                self.complete(p.fut, None, RpcTimeoutError(
                    f"RPC ran for more than set timeout ({p.timeout} s) calling {p.what} "
                    f"on {self.members.describe(p.dst)}"))

    def drop_calls_to(self, rank):
        """``rank`` died or left: remove every call to it from the table and return them,
        to be failed by :meth:`fail_dropped` (once the rest of this process forgot it)."""
        return self.calls.fail_peer(rank)

    def fail_dropped(self, rank, why, dropped):
        for p in dropped:
            if p.fut is not None:
                self.complete(p.fut, None, WorkerUnreachableError(self.gone(rank, why, p.what)))

    def fail_all(self, err):
        """No call can be answered any more (the I/O thread failed): fail them all with
        ``err``, and every later call too."""
        for p in self.calls.close(err):
            if p.fut is not None:
                self.complete(p.fut, None, err)

    def complete(self, fut, value, exc):
        if fut.has_blocking_callbacks():  # user callbacks may block: never on the I/O thread
            self.stats["handoffs"] += 1
            self.pool.submit(fut._complete, value, exc)
        else:
            if fut.has_waiter():
                self.stats["handoffs"] += 1  # the thread waiting for it runs on
            fut._complete(value, exc)

    def wait_pending(self, deadline, among=None):
        """Wait until no call waits for its reply (of ``among``, message ids, when given), or
        ``deadline``, or the I/O thread is gone; whether none waits."""
        while self.calls.any_of(among) if among is not None else len(self.calls):
            if time.monotonic() > deadline or not self.transport.running():
                return False
            time.sleep(0.005)
        return True

"""The owner's side of RRefs: the values this process holds for others, and their lifetimes.

Lifetime protocol (reference counting by fork): every RRef object, on the owner
or elsewhere, holds a *fork id* counted in the owner's entry for its RRef id.
Creating an object adds one to its fork (``remote()`` carries the fork in the
request; an RRef sent as an argument gets a new fork that the sender registers
with the owner, keeping its own RRef alive until the owner acknowledged);
deleting one subtracts one. Counts are per fork and may go negative for a while
when messages cross, so their order does not matter; the owner frees a value
once no fork has a non-zero count and the value is ready.

Peers can grow this table, so it is bounded and checked against what a peer may
legitimately send:

* a fork id is ``(creator rank, counter)``: only its creator registers it;
* an entry that a peer's messages created but that never received a value (a
  forged id, or the creating call lost with a dead peer) expires after
  ``ttl`` seconds; at most ``max_entries`` entries exist, of which at most
  ``max_pending_per_peer`` were created by one peer and have no value yet (a peer at
  its bound cannot fill the table for the others), ``max_waiting`` fetches per peer
  wait for a value;
* a fetch of a value that is not ready does not hold a thread: it is a Future,
  failed with a timeout if the value does not come.
"""
import threading
import time

from .errors import RefusedCallError, RpcError, RpcTimeoutError
from ..futures import Future

__all__ = ["OwnerTable", "OwnerOps"]


class _Entry:
    __slots__ = ("value", "exc", "ready", "forks", "waiters", "expires", "src", "pending")

    def __init__(self, expires, src):
        self.value = None
        self.exc = None
        self.ready = False
        self.forks = {}
        self.waiters = []        # (Future, deadline, src) of fetches waiting for the value
        self.expires = expires   # an entry that never gets a value is dropped then
        self.src = src           # the peer whose message created the entry (None: this process)
        self.pending = src is not None   # counted in its peer's entries without a value


def _rref_id(x, what):
    if type(x) in (list, tuple) and len(x) == 2 and all(type(i) is int for i in x):
        return tuple(x)
    raise RefusedCallError(f"malformed {what} {x!r}")


class OwnerTable:
    """Values this process owns on behalf of RRefs, with their fork counts."""

    def __init__(self, world_size, ttl=120.0, max_entries=1 << 20, max_waiting=4096,
                 max_pending_per_peer=1 << 16):
        self._lock = threading.RLock()  # re-entrant: RRef.__del__ may run inside a locked section
        self._ready = threading.Condition(self._lock)
        self._entries = {}
        self.world_size = world_size
        self.ttl, self.max_entries, self.max_waiting = ttl, max_entries, max_waiting
        self._waiting = {}   # src -> number of parked fetches
        self.max_pending_per_peer = max_pending_per_peer
        self._pending = {}   # src -> entries its messages created that have no value yet
        self.next_expiry = float("inf")

    def __len__(self):
        return len(self._entries)

    def _entry(self, rid, src):  # with the lock held
        e = self._entries.get(rid)
        if e is None:
            if len(self._entries) >= self.max_entries:
                raise RpcError(f"RRef owner table full ({self.max_entries} entries)")
            if src is not None and self._pending.get(src, 0) >= self.max_pending_per_peer:
                raise RpcError(f"rank {src} already made {self.max_pending_per_peer} RRef "
                               "entries here that have no value yet, its bound")
            expires = time.monotonic() + self.ttl if src is not None else float("inf")
            e = self._entries[rid] = _Entry(expires, src)
            if src is not None:
                self._pending[src] = self._pending.get(src, 0) + 1
            self.next_expiry = min(self.next_expiry, expires)
        return e

    def _settle(self, e):  # with the lock held: the entry has a value or is gone
        if e.pending:
            e.pending = False
            self._pending[e.src] -= 1

    def _maybe_free(self, rid, e):  # with the lock held
        if e.ready and not e.forks:
            self._entries.pop(rid, None)

    # ------------------------------------------------------------------ forks
    def add_fork(self, rid, fid, delta, src=None):
        """Count ``delta`` on fork ``fid`` of ``rid``; ``src`` is the peer that sent it."""
        rid, fid = _rref_id(rid, "RRef id"), _rref_id(fid, "fork id")
        if src is not None and delta > 0 and fid[0] != src:
            raise RefusedCallError(f"rank {src} may not register fork {fid} (created by rank "
                                   f"{fid[0]})")
        with self._lock:
            e = self._entry(rid, src)
            c = e.forks.get(fid, 0) + delta
            if c:
                e.forks[fid] = c
            else:
                e.forks.pop(fid, None)
            self._maybe_free(rid, e)

    # ------------------------------------------------------------------ values
    def set_value(self, rid, value, exc=None):
        with self._lock:
            e = self._entry(rid, None)
            e.value, e.exc, e.ready = value, exc, True
            self._settle(e)
            e.expires = float("inf")
            waiters, e.waiters = e.waiters, []
            for _, _, src in waiters:
                self._waiting[src] = self._waiting.get(src, 1) - 1
            self._maybe_free(rid, e)
            self._ready.notify_all()
        for fut, _, _ in waiters:
            if exc is None:
                fut.set_result(value)
            else:
                fut.set_exception(exc)

    def get(self, rid, timeout=None):
        """The value (blocking, for this process's own RRefs)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._lock:
            while True:
                e = self._entries.get(rid)
                if e is not None and e.ready:
                    break
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    raise RpcTimeoutError(f"RRef {rid} value not ready within {timeout} s")
                self._ready.wait(left if left is None else min(left, 1.0))
        if e.exc is not None:
            raise e.exc
        return e.value

    def fetch(self, rid, src, timeout):
        """A Future of the value of ``rid`` for peer ``src``: done now if the value is ready,
        else when it is set (or failed after ``timeout`` seconds, without holding a thread)."""
        rid = _rref_id(rid, "RRef id")
        fut = Future()
        with self._lock:
            e = self._entries.get(rid)
            if e is None or not e.ready:
                if self._waiting.get(src, 0) >= self.max_waiting:
                    raise RpcError(f"rank {src} already waits for {self.max_waiting} RRef values")
                e = self._entry(rid, src)
                deadline = time.monotonic() + (timeout if timeout else self.ttl)
                e.waiters.append((fut, deadline, src))
                self._waiting[src] = self._waiting.get(src, 0) + 1
                self.next_expiry = min(self.next_expiry, deadline)
                return fut
        if e.exc is not None:
            fut.set_exception(e.exc)
        else:
            fut.set_result(e.value)
        return fut

    def expire(self, now):
        """Fail fetches that waited too long; drop entries that never got a value."""
        failed = []
        with self._lock:
            if now < self.next_expiry:
                return
            nxt = float("inf")
            for rid, e in list(self._entries.items()):
                keep = []
                for w in e.waiters:
                    if w[1] <= now:
                        failed.append((rid, w[0]))
                        self._waiting[w[2]] = self._waiting.get(w[2], 1) - 1
                    else:
                        keep.append(w)
                        nxt = min(nxt, w[1])
                e.waiters = keep
                if not e.ready and not e.waiters and e.expires <= now:
                    del self._entries[rid]
                    self._settle(e)
                elif not e.ready:
                    nxt = min(nxt, e.expires)
            self.next_expiry = nxt
        for rid, fut in failed:
            fut.set_exception(RpcTimeoutError(f"RRef {rid} has no value on its owner after "
                                              "waiting for it (never created, or its creator died)"))

    def forget_peer(self, src):
        """A peer died: entries its messages created that have no value yet will not get one."""
        with self._lock:
            for rid, e in list(self._entries.items()):
                if e.src == src and not e.ready and not e.waiters:
                    del self._entries[rid]
                    self._settle(e)

    def clear(self):
        with self._lock:
            waiters = [w[0] for e in self._entries.values() for w in e.waiters]
            self._entries.clear()
            self._waiting.clear()
            self._pending.clear()
        for fut in waiters:
            fut.set_exception(RpcError("the RRef owner shut down"))


class OwnerOps:
    """The internal operations peers call on an owner (``@rref.*`` targets).

    Each gets the :class:`~distgrad.rpc.dispatch.Request` first, so it knows who
    asks. ``run_later(fn)`` runs ``fn`` on a handler thread; ``timeout`` is the
    default RPC timeout.
    """

    def __init__(self, table, allowlist, run_later, timeout):
        self.table, self.allowlist = table, allowlist
        self.run_later, self.timeout = run_later, timeout

    def operations(self):
        return {"@rref.fetch": self.fetch, "@rref.call": self.call}

    def fetch(self, request, rid):
        return self.table.fetch(rid, request.src, self.timeout)

    def call(self, request, rid, method, args, kwargs):
        """``value.method(*args, **kwargs)`` once the value is there (no thread waits)."""
        if type(args) not in (list, tuple) or not isinstance(kwargs or {}, dict):
            raise RefusedCallError("malformed RRef method call")
        value_fut = self.table.fetch(rid, request.src, self.timeout)
        if value_fut.done():
            return self.allowlist.method(value_fut.value(), method)(*args, **(kwargs or {}))
        out = Future()

        def run(value):
            try:
                out.set_result(self.allowlist.method(value, method)(*args, **(kwargs or {})))
            except BaseException as e:  # noqa: BLE001 - the caller gets it
                out.set_exception(e)

        def ready(f):
            exc = f.exception()
            if exc is not None:
                out.set_exception(exc)
            else:
                self.run_later(request, run, f.value())
        value_fut._add_inline_callback(ready)  # ready() only queues the call
        return out

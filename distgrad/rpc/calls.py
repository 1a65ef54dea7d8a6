"""Calls waiting for their reply: deadlines, peer failure and in-flight limits, under one lock.

Every outgoing CALL, asynchronous or blocking, holds a slot of its destination
until its reply (or its failure) arrives. A destination has at most
``max_inflight`` slots; the caller of a further call waits for one (or, with
``block=False``, gets :class:`BackpressureError`), so a flood of ``rpc_async``
cannot queue without limit. Futures are completed by the caller of
:meth:`pop`/:meth:`expire`/:meth:`fail_peer` *outside* the lock: completing one
runs callbacks.
"""
import threading
import time

from .errors import BackpressureError, RpcError, RpcTimeoutError

__all__ = ["Pending", "PendingCalls"]

_FOREVER = float("inf")


class Pending:
    """One call in flight: the Future its reply completes, its destination and deadline."""

    __slots__ = ("fut", "dst", "deadline", "what", "timeout")

    def __init__(self, fut, dst, deadline, what, timeout):
        self.fut, self.dst, self.deadline, self.what, self.timeout = fut, dst, deadline, what, timeout


class PendingCalls:
    def __init__(self, world_size, max_inflight):
        self._lock = threading.Lock()
        self._slot_freed = threading.Condition(self._lock)
        self._calls = {}                       # msg id -> Pending
        self._inflight = [0] * world_size      # per destination rank
        self._max = max_inflight
        self._waiting = 0                      # callers waiting for a slot (notified when freed)
        self._closed = None                    # the error new calls get once closed
        self.next_deadline = _FOREVER

    def __len__(self):
        return len(self._calls)

    def ids(self):
        """The message ids of the calls waiting for their reply now."""
        with self._lock:
            return set(self._calls)

    def any_of(self, ids):
        """Whether any of the calls ``ids`` still waits for its reply."""
        with self._lock:
            return any(mid in self._calls for mid in ids)

    def inflight(self, dst):
        return self._inflight[dst]

    # ------------------------------------------------------------------ admission
    def add(self, mid, pending, block=True):
        """Register a call, waiting for a slot of its destination (backpressure). Returns
        whether its deadline is now the earliest (whoever expires calls should look again)."""
        dst = pending.dst
        with self._lock:
            while self._closed is None and self._inflight[dst] >= self._max:
                if not block:
                    raise BackpressureError(
                        f"{self._max} calls to rank {dst} are already in flight "
                        "(RpcBackendOptions.max_inflight_per_worker)")
                left = pending.deadline - time.monotonic()
                if left <= 0:
                    raise RpcTimeoutError(
                        f"RPC ran for more than set timeout ({pending.timeout} s) waiting "
                        f"for one of the {self._max} in-flight calls to rank {dst} to finish")
                self._waiting += 1
                try:
                    self._slot_freed.wait(min(left, 1.0))
                finally:
                    self._waiting -= 1
            if self._closed is not None:
                raise self._closed
            self._inflight[dst] += 1
            self._calls[mid] = pending
            if pending.deadline < self.next_deadline:
                self.next_deadline = pending.deadline
                return True
            return False

    def _release(self, p):  # with the lock held
        self._inflight[p.dst] -= 1
        if self._waiting:  # (a reply costs no notify while nobody waits for a slot)
            self._slot_freed.notify()

    # ------------------------------------------------------------------ completion
    def pop(self, mid, src=None):
        """The call ``mid`` is answered by rank ``src``: remove and return it (None if unknown,
        late, or not a call to ``src``)."""
        with self._lock:
            p = self._calls.get(mid)
            if p is None or (src is not None and p.dst != src):
                return None
            del self._calls[mid]
            self._release(p)
            return p

    def expire(self, now):
        """Remove and return the calls whose deadline passed."""
        with self._lock:
            if now < self.next_deadline:
                return []
            out = [(mid, p) for mid, p in self._calls.items() if p.deadline <= now]
            for mid, p in out:
                del self._calls[mid]
                self._release(p)
            self.next_deadline = min((p.deadline for p in self._calls.values()), default=_FOREVER)
            return [p for _, p in out]

    def fail_peer(self, dst):
        """Remove and return every call to ``dst`` (it died or left)."""
        with self._lock:
            out = [(mid, p) for mid, p in self._calls.items() if p.dst == dst]
            for mid, p in out:
                del self._calls[mid]
                self._release(p)
            return [p for _, p in out]

    def close(self, exc):
        """From now on :meth:`add` raises ``exc``; remove and return every call."""
        with self._lock:
            self._closed = exc if isinstance(exc, BaseException) else RpcError(str(exc))
            out = list(self._calls.values())
            self._calls.clear()
            self._inflight = [0] * len(self._inflight)
            self._slot_freed.notify_all()
            return out

    def describe(self, limit=8):
        """A short text of what is pending (for error messages and hang reports)."""
        with self._lock:
            items = list(self._calls.values())
        by = {}
        for p in items:
            by.setdefault((p.dst, p.what), 0)
            by[(p.dst, p.what)] += 1
        parts = [f"{n} x {what} to rank {dst}" for (dst, what), n in list(by.items())[:limit]]
        return ", ".join(parts) + (" ..." if len(by) > limit else "")

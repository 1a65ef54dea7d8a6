"""Tiers with a budget: process memory up to N bytes, then another tier.

Backward needs the tensors saved last first, so when the memory budget is full
the record saved *earliest* (needed last) moves on to the next tier and the new
one stays in memory: at the end of forward, memory holds exactly what backward
starts with.
"""
import threading
from collections import OrderedDict

__all__ = ["MemoryTier"]


class MemoryTier:
    """Keep up to ``budget_bytes`` in memory (no copy), the rest in ``then``.

    >>> from distgrad.offload.disk import DiskTier
    >>> import numpy as np
    >>> tier = MemoryTier(16, then=DiskTier())
    >>> for k in range(3):
    ...     _ = tier.put(k, np.full(8, k, dtype=np.uint8))
    >>> tier.in_memory()          # record 0 moved to disk: backward needs it last
    [1, 2]
    >>> tier.get(0).tolist()[:2]
    [0, 0]
    >>> tier.close()
    """

    def __init__(self, budget_bytes, then):
        if budget_bytes < 0:
            raise ValueError(f"budget_bytes must be >= 0, got {budget_bytes}")
        self.budget_bytes = int(budget_bytes)
        self.then = then
        self.where = f"memory ({budget_bytes} bytes), then {then.describe()}"
        self._lock = threading.Lock()
        self._held = OrderedDict()   # key -> payload, oldest (needed last) first
        self._moving = {}            # key -> payload being handed to the next tier
        self._dropped = set()        # keys deleted while they were moving
        self._bytes = 0

    def describe(self):
        return f"memory tier of {self.budget_bytes} bytes over {self.then.describe()}"

    def put(self, key, payload):
        n = payload.nbytes
        evict = []
        with self._lock:
            if n > self.budget_bytes:
                evict.append((key, payload))
            else:
                while self._held and self._bytes + n > self.budget_bytes:
                    k, p = self._held.popitem(last=False)
                    self._bytes -= p.nbytes
                    evict.append((k, p))
                self._held[key] = payload
                self._bytes += n
            for k, p in evict:
                self._moving[k] = p
        waited = 0.0
        for k, p in evict:
            try:
                waited += self.then.put(k, p)
            finally:
                with self._lock:
                    self._moving.pop(k, None)
                    dropped = k in self._dropped
                    self._dropped.discard(k)
            if dropped:
                self.then.delete(k)
        return waited

    def get(self, key, align=0):
        with self._lock:
            payload = self._held.get(key)
            if payload is None:
                payload = self._moving.get(key)
        if payload is not None:
            return payload
        return self.then.get(key, align)

    def holds(self, key):
        with self._lock:
            if key in self._held or key in self._moving:
                return True
        return self.then.holds(key)

    def flush(self, timeout=60.0):
        self.then.flush(timeout)

    def delete(self, key):
        with self._lock:
            payload = self._held.pop(key, None)
            if payload is not None:
                self._bytes -= payload.nbytes
                return
            if key in self._moving:
                self._dropped.add(key)
                return
        self.then.delete(key)

    def observe(self, fn):
        """Report the next tier's I/O (keeping bytes here costs none)."""
        observe = getattr(self.then, "observe", None)
        if observe is not None:
            observe(fn)

    def in_memory(self):
        with self._lock:
            return list(self._held)

    def stats(self):
        with self._lock:
            mine = {"memory_bytes": self._bytes, "memory_records": len(self._held)}
        return {**mine, "then": self.then.stats()}

    def close(self):
        with self._lock:
            self._held.clear()
            self._bytes = 0
        self.then.close()


def check_tier(tier):
    """Raise TypeError unless ``tier`` has the tier interface."""
    missing = [m for m in ("put", "get", "delete", "close", "describe", "holds", "flush")
               if not callable(getattr(tier, m, None))]
    if missing:
        raise TypeError(f"{type(tier).__name__} is not a tier: it lacks {', '.join(missing)}")
    return tier


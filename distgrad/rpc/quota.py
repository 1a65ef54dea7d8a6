"""What one peer's requests may make this process hold while they are decoded and served.

Decoding a request body turns msgpack into Python objects, many times its size; a
flood of large bodies decoded at once would blow the memory up, and one of bad
messages would start a handler thread for each. So the requests of each peer are
admitted to decoding through a gate of their own (:class:`PeerGate`): at most
``slots`` of them decode at once, holding at most ``decoding_bytes`` of bodies (one
is always admitted, whatever its size); the others wait, in arrival order, and a
peer may keep at most ``waiting_requests`` requests and ``waiting_bytes`` of bodies
waiting: beyond that its request is refused at once with a
:class:`~distgrad.rpc.errors.BackpressureError` that says why.

A peer holds at most its share of handler threads (``serving``: decoding or running its
requests; by default ``1024 // world_size``, at least 16); further requests wait for one
to finish. Unless none does: handlers that wait for the same peer's later requests (a
peer's own nesting: a handler waiting for an event that a later request sets, or for a
nested call that calls back) would wait for ever behind their own share. So when a peer's
share is full, it has requests waiting and none of its requests finished for
:data:`STALLED_AFTER` seconds (:meth:`PeerGate.stalled`), its waiting requests start past
the share, up to twice it; if it stalls there too, they are refused at once, saying so,
and so are those that come while it holds twice its share. Other peers' gates are
untouched: a peer at its bound locks nobody else out (twice one share and the others'
shares fit the pool's 1,024 threads).

Decoding never waits for another request, so requests waiting for their peer's
decoding cannot deadlock. Array buffers are not counted: they are views of the received
frames, not copies.
"""
import collections
import threading
import time

from .errors import BackpressureError

__all__ = ["PeerGate", "STALLED_AFTER"]

#: Seconds a peer's full share of handler threads may go without one of its requests
#: finishing before its waiting requests start past the share (or, past twice it, are
#: refused).
STALLED_AFTER = 0.5


class _Peer:
    __slots__ = ("decoding", "decoding_bytes", "waiting", "waiting_bytes", "serving",
                 "progress", "grown")

    def __init__(self):
        self.decoding = self.decoding_bytes = self.waiting_bytes = self.serving = 0
        self.waiting = collections.deque()   # (size, job)
        self.progress = 0.0   # when one of its requests last finished (or the first started)
        self.grown = False    # its requests may hold twice its share (it stalled at it)


class PeerGate:
    def __init__(self, world_size, slots=4, decoding_bytes=16 << 20, waiting_requests=4096,
                 waiting_bytes=256 << 20, serving=None, stalled_after=STALLED_AFTER):
        self.slots, self.decoding_bytes = slots, decoding_bytes
        self.serving = serving if serving is not None else max(16, 1024 // world_size)
        self.waiting_requests, self.waiting_bytes = waiting_requests, waiting_bytes
        self.stalled_after = stalled_after
        self._lock = threading.Lock()
        self._peers = [_Peer() for _ in range(world_size)]
        self._full = set()   # peers whose share is full while requests of theirs wait
        #: when :meth:`stalled` may have something to do (the I/O thread's poll waits for it)
        self.next_check = float("inf")

    def _fits(self, p, size):
        return p.decoding == 0 or (p.decoding < self.slots
                                   and p.decoding_bytes + size <= self.decoding_bytes)

    def _bound(self, p):
        return 2 * self.serving if p.grown else self.serving

    def _twice_the_share(self, src, p):
        return BackpressureError(
            f"rank {src} has {p.serving} requests being served here, twice its share of "
            f"handler threads ({self.serving}), and none of them finished for "
            f"{self.stalled_after:g} s: they may be waiting for this request, which would "
            "wait for ever: it was refused (a handler that waits for a later request of its "
            "own caller needs that request to come before its share is full)")

    def admit(self, src, size, job):
        """A request of ``size`` body bytes from rank ``src``: True if ``job`` may decode
        now (its decoding is counted), False if it waits (:meth:`decoded`,
        :meth:`finished` or :meth:`stalled` return it later); :class:`BackpressureError`
        if ``src`` is at its bound."""
        with self._lock:
            p = self._peers[src]
            if p.grown and p.serving >= 2 * self.serving:
                raise self._twice_the_share(src, p)
            if not p.waiting and p.serving < self._bound(p) and self._fits(p, size):
                if p.serving == 0:
                    p.progress = time.monotonic()
                p.serving += 1
                p.decoding += 1
                p.decoding_bytes += size
                return True
            if len(p.waiting) >= self.waiting_requests \
                    or p.waiting_bytes + size > self.waiting_bytes:
                raise BackpressureError(
                    f"rank {src} has {len(p.waiting)} requests ({p.waiting_bytes} bytes of "
                    f"bodies) waiting to be served here, its bound (at most "
                    f"{self.waiting_requests} requests, {self.waiting_bytes} bytes): the "
                    "request was refused; send fewer at once")
            p.waiting.append((size, job))
            p.waiting_bytes += size
            self._note_full(src, p)
            return False

    def _note_full(self, src, p):  # with the lock held
        if p.waiting and p.serving >= self._bound(p):
            self._full.add(src)
            self.next_check = min(self.next_check, p.progress + self.stalled_after)

    def _admit_next(self, src, p):  # with the lock held
        ready = []
        while p.waiting and p.serving < self._bound(p) and self._fits(p, p.waiting[0][0]):
            size, job = p.waiting.popleft()
            p.waiting_bytes -= size
            p.decoding += 1
            p.decoding_bytes += size
            p.serving += 1
            ready.append(job)
        self._note_full(src, p)
        return ready

    def decoded(self, src, size):
        """A request of ``src`` finished decoding; return the waiting jobs that may decode
        now (counted), in arrival order."""
        with self._lock:
            p = self._peers[src]
            p.decoding -= 1
            p.decoding_bytes -= size
            return self._admit_next(src, p)

    def finished(self, src):
        """A request of ``src`` is done with its handler thread; return the waiting jobs
        that may decode now (counted)."""
        with self._lock:
            p = self._peers[src]
            p.serving -= 1
            p.progress = time.monotonic()
            if p.serving < self.serving:
                p.grown = False
            return self._admit_next(src, p)

    def stalled(self, now):
        """(I/O thread, once ``now`` reaches :attr:`next_check`) The peers whose full share
        made no progress for ``stalled_after``: their waiting requests start past the share
        (up to twice it), or, already past it, are refused. Returns ``(ready, refused)``:
        jobs that may decode now (counted), and ``(job, error)`` pairs to answer."""
        ready, refused = [], []
        with self._lock:
            self.next_check = float("inf")
            for src in list(self._full):
                p = self._peers[src]
                if not p.waiting or p.serving < self._bound(p):
                    self._full.discard(src)
                    continue
                if now < p.progress + self.stalled_after:
                    self.next_check = min(self.next_check, p.progress + self.stalled_after)
                    continue
                self._full.discard(src)
                if not p.grown:
                    p.grown = True
                    p.progress = now  # the grown ones get as long to show progress
                    ready.extend(self._admit_next(src, p))
                    continue
                error = self._twice_the_share(src, p)
                refused.extend((job, error) for _, job in p.waiting)
                p.waiting.clear()
                p.waiting_bytes = 0
        return ready, refused

    def load(self, src):
        """(decoding, waiting, serving) requests of ``src`` now."""
        with self._lock:
            p = self._peers[src]
            return p.decoding, len(p.waiting), p.serving

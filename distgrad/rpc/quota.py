"""What one peer's requests may make this process hold while they are decoded.

Decoding a request body turns msgpack into Python objects, many times its size; a
flood of large bodies decoded at once would blow the memory up, and one of bad
messages would start a handler thread for each. So the requests of each peer are
admitted to decoding through a gate of their own (:class:`PeerGate`): at most
``slots`` of them decode at once, holding at most ``decoding_bytes`` of bodies (one
is always admitted, whatever its size); the others wait, in arrival order, and a
peer may keep at most ``waiting_requests`` requests and ``waiting_bytes`` of bodies
waiting: beyond that its request is refused at once with a
:class:`~distgrad.rpc.errors.BackpressureError` that says why. And a peer holds at most
``serving`` handler threads (decoding or running its requests; by default a share of
the pool, ``1024 // world_size``, at least 16): a request that comes while it holds
them all is refused the same way, and waiting ones wait for one to finish. Other
peers' gates are untouched: a peer at its bound locks nobody else out.

Decoding never waits for another request, so requests waiting for their peer's
decoding cannot deadlock (once decoded, a request runs on its thread as before:
nested calls still get a thread, up to the peer's share). Array buffers are not counted: they are views of
the received frames, not copies.
"""
import collections
import threading

from .errors import BackpressureError

__all__ = ["PeerGate"]


class _Peer:
    __slots__ = ("decoding", "decoding_bytes", "waiting", "waiting_bytes", "serving")

    def __init__(self):
        self.decoding = self.decoding_bytes = self.waiting_bytes = self.serving = 0
        self.waiting = collections.deque()   # (size, job)


class PeerGate:
    def __init__(self, world_size, slots=4, decoding_bytes=16 << 20, waiting_requests=4096,
                 waiting_bytes=256 << 20, serving=None):
        self.slots, self.decoding_bytes = slots, decoding_bytes
        self.serving = serving if serving is not None else max(16, 1024 // world_size)
        self.waiting_requests, self.waiting_bytes = waiting_requests, waiting_bytes
        self._lock = threading.Lock()
        self._peers = [_Peer() for _ in range(world_size)]

    def _fits(self, p, size):
        return p.decoding == 0 or (p.decoding < self.slots
                                   and p.decoding_bytes + size <= self.decoding_bytes)

    def admit(self, src, size, job):
        """A request of ``size`` body bytes from rank ``src``: True if ``job`` may decode
        now (its decoding is counted), False if it waits (:meth:`decoded` returns it
        later); :class:`BackpressureError` if ``src`` is at its bound."""
        with self._lock:
            p = self._peers[src]
            if p.serving >= self.serving:
                raise BackpressureError(
                    f"rank {src} has {p.serving} requests being served here, its bound "
                    f"({self.serving} handler threads): the request was refused; wait for "
                    "some to finish")
            if not p.waiting and self._fits(p, size):
                p.serving += 1
                p.decoding += 1
                p.decoding_bytes += size
                return True
            if len(p.waiting) >= self.waiting_requests \
                    or p.waiting_bytes + size > self.waiting_bytes:
                raise BackpressureError(
                    f"rank {src} has {len(p.waiting)} requests ({p.waiting_bytes} bytes of "
                    f"bodies) waiting to be decoded here, its bound (at most "
                    f"{self.waiting_requests} requests, {self.waiting_bytes} bytes): the "
                    "request was refused; send fewer at once")
            p.waiting.append((size, job))
            p.waiting_bytes += size
            return False

    def _admit_next(self, p):  # with the lock held
        ready = []
        while p.waiting and p.serving < self.serving and self._fits(p, p.waiting[0][0]):
            size, job = p.waiting.popleft()
            p.waiting_bytes -= size
            p.decoding += 1
            p.decoding_bytes += size
            p.serving += 1
            ready.append(job)
        return ready

    def decoded(self, src, size):
        """A request of ``src`` finished decoding; return the waiting jobs that may decode
        now (counted), in arrival order."""
        with self._lock:
            p = self._peers[src]
            p.decoding -= 1
            p.decoding_bytes -= size
            return self._admit_next(p)

    def finished(self, src):
        """A request of ``src`` is done with its handler thread; return the waiting jobs
        that may decode now (counted)."""
        with self._lock:
            p = self._peers[src]
            p.serving -= 1
            return self._admit_next(p)

    def load(self, src):
        """(decoding, waiting, serving) requests of ``src`` now."""
        with self._lock:
            p = self._peers[src]
            return p.decoding, len(p.waiting), p.serving

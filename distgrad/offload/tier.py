"""A tier: where offloaded bytes live between forward and backward.

Every tier has the same life cycle for a record, written once here:

* ``put(key, payload)`` hands the bytes over and returns at once; the tier keeps a
  reference to them until they are stored (a disk write, a store's
  acknowledgement), so a ``get`` before then is served from memory. Puts block
  only while more than ``max_inflight_bytes`` are on their way, so the forward
  pass cannot outrun the tier and balloon memory.
* ``get(key, align)`` returns the bytes (read-only uint8, at an address agreeing with
  ``align``, the source's, see :func:`frame_payload`); a failed store or read raises an
  :class:`~distgrad.offload.errors.OffloadError` naming the file or the store.
* ``delete(key)`` frees the record, also while its put is still on its way.
* ``holds(key)`` says whether a get would cost no I/O; ``flush()`` waits for
  every put to be stored; ``close()`` frees everything; ``describe()`` names it.
* ``observe(fn)``: ``fn(kind, nbytes, start_ns, end_ns)`` is called for every write
  (``"write"``: from the put to its being stored) and every read that cost I/O
  (``"read"``), timestamps of ``time.perf_counter_ns``, from whichever thread did
  it (a launch's trace draws them).

Subclasses implement ``_start_put``, ``_read``, ``_remove`` and call
:meth:`Tier._stored` when a put finishes.
"""
import threading
import time

import numpy as np

from .errors import OffloadError

__all__ = ["Tier"]

#: The longest a put waits for room in flight before the tier is declared stuck.
PUT_TIMEOUT = 120.0


class Tier:
    #: Where the bytes go, for error messages (a directory, a store's endpoint).
    where = "?"

    def __init__(self, max_inflight_bytes=64 << 20):
        if max_inflight_bytes <= 0:
            raise ValueError(f"max_inflight_bytes must be positive, got {max_inflight_bytes}")
        self.max_inflight_bytes = int(max_inflight_bytes)
        self._cond = threading.Condition(threading.Lock())
        self._pending = {}     # key -> payload, until stored
        self._cancelled = set()  # pending keys deleted before they were stored
        self._errors = {}      # key -> exception of a failed put
        self._inflight = 0
        self._closed = False
        self._observer = None
        self._put_started = {}  # key -> perf_counter_ns of its put, while observed

    # ------------------------------------------------------------ public
    def observe(self, fn):
        """Report every write and every read that cost I/O to ``fn`` (None: stop)."""
        with self._cond:
            self._observer = fn
            self._put_started.clear()
    def put(self, key, payload):
        """Start storing ``payload`` (a uint8 array) as ``key``; return the seconds waited."""
        n = payload.nbytes
        waited = 0.0
        with self._cond:
            if self._closed:
                raise OffloadError(f"{self.describe()} is closed")
            if self._inflight and self._inflight + n > self.max_inflight_bytes:
                t0 = time.perf_counter()
                deadline = t0 + PUT_TIMEOUT
                while self._inflight and self._inflight + n > self.max_inflight_bytes:
                    left = deadline - time.perf_counter()
                    if left <= 0:
                        raise OffloadError(f"{self.describe()} stored nothing for {PUT_TIMEOUT:g}"
                                           f" s ({self._inflight} bytes in flight)")
                    self._cond.wait(min(left, 1.0))
                waited = time.perf_counter() - t0
            self._inflight += n
            self._pending[key] = payload
            if self._observer is not None:
                self._put_started[key] = time.perf_counter_ns()
        self._start_put(key, payload)
        return waited

    def get(self, key, align=0):
        """The stored bytes of ``key`` (read-only uint8)."""
        with self._cond:
            payload = self._pending.get(key)
            error = self._errors.get(key)
        if payload is not None:
            return payload
        if error is not None:
            raise error
        observer = self._observer
        if observer is None:
            return self._read(key, align)
        start = time.perf_counter_ns()
        data = self._read(key, align)
        observer("read", data.nbytes, start, time.perf_counter_ns())
        return data

    def holds(self, key):
        """Whether ``key``'s bytes are still in this process (a get costs no I/O)."""
        with self._cond:
            return key in self._pending

    def flush(self, timeout=60.0):
        """Wait until every put so far is stored."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while self._inflight:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise OffloadError(f"{self.describe()} did not store {self._inflight} bytes "
                                       f"within {timeout:g} s")
                self._cond.wait(min(left, 0.5))

    def delete(self, key):
        with self._cond:
            self._errors.pop(key, None)
            if key in self._pending:
                self._cancelled.add(key)
                return
        self._remove(key)

    def close(self):
        """Stop accepting puts; subclasses release their threads and storage."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    def describe(self):
        return f"{type(self).__name__} at {self.where}"

    def stats(self):
        with self._cond:
            return {"inflight_bytes": self._inflight, "pending": len(self._pending)}

    # ------------------------------------------------------------ for subclasses
    def _was_cancelled(self, key):
        with self._cond:
            return key in self._cancelled

    def _stored(self, key, error=None):
        """A put finished (``error`` is an exception if it failed)."""
        with self._cond:
            payload = self._pending.pop(key, None)
            if payload is None:
                return
            self._inflight -= payload.nbytes
            cancelled = key in self._cancelled
            self._cancelled.discard(key)
            if error is not None and not cancelled:
                self._errors[key] = error
            self._cond.notify_all()
            started, observer = self._put_started.pop(key, None), self._observer
        if started is not None and observer is not None and error is None:
            observer("write", payload.nbytes, started, time.perf_counter_ns())
        del payload
        if cancelled and error is None:
            self._remove(key)

    def _fail_all_pending(self, error_for):
        """Fail every put still on its way (the store died): ``error_for(key)`` builds the error."""
        with self._cond:
            keys = list(self._pending)
        for key in keys:
            self._stored(key, error_for(key))

    def _start_put(self, key, payload):
        raise NotImplementedError

    def _read(self, key, align):
        raise NotImplementedError

    def _remove(self, key):
        raise NotImplementedError


#: A received blob is used where it landed if its address agrees with the source's
#: modulo this (NumPy's alignment of every dtype); otherwise it is copied.
FRAME_ALIGN = 8


def frame_payload(buf, align):
    """A received blob as a read-only uint8 array whose address agrees with ``align``
    modulo :data:`FRAME_ALIGN`, so every element is aligned as at the source; copied
    only when it does not (a copy would double the bytes held while it is made).
    NumPy's and OpenBLAS's results do not depend on alignment beyond that; the
    disk tier, where it costs nothing, keeps the source's alignment mod 64."""
    from .records import aligned_empty
    arr = buf if isinstance(buf, np.ndarray) else np.frombuffer(buf, dtype=np.uint8)
    if arr.ctypes.data % FRAME_ALIGN != align % FRAME_ALIGN:
        out = aligned_empty(arr.nbytes, align)
        out[...] = arr
        arr = out
    if arr.flags.writeable:
        arr.flags.writeable = False
    return arr

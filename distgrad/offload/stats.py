"""Counters kept by every offloading hook object."""
import threading

__all__ = ["OffloadStats"]


class OffloadStats:
    """What a hook object did: updated under its lock, read with :meth:`as_dict`.

    ``tensors_offloaded``/``bytes_offloaded``: saved tensors sent to the tier and the
    bytes actually stored for them; ``tensors_kept``: saved tensors left in memory
    (below the size threshold, excluded by the policy, parameters and other leaves);
    ``tensors_deduplicated``/``bytes_deduplicated``: saved tensors whose memory was
    already stored, and the bytes that were therefore not stored again;
    ``prefetch_hits``/``prefetch_misses``: unpacks served from memory (read ahead,
    still pending, or still alive) versus read on demand; ``bytes_read``: what was
    read back from the tier (ahead or on demand); ``forward_wait_s``: time
    the forward pass waited for bytes in flight to drain; ``backward_wait_s``: time
    unpacking waited for reads.
    """

    FIELDS = ("tensors_offloaded", "bytes_offloaded", "tensors_kept", "tensors_deduplicated",
              "bytes_deduplicated", "prefetch_hits", "prefetch_misses", "bytes_read",
              "forward_wait_s", "backward_wait_s")

    def __init__(self):
        self._lock = threading.Lock()
        for f in self.FIELDS:
            setattr(self, f, 0.0 if f.endswith("_s") else 0)

    def add(self, **amounts):
        with self._lock:
            for k, v in amounts.items():
                setattr(self, k, getattr(self, k) + v)

    def as_dict(self):
        with self._lock:
            return {f: getattr(self, f) for f in self.FIELDS}

    def __repr__(self):
        return "OffloadStats(" + ", ".join(f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}"
                                           for k, v in self.as_dict().items()) + ")"

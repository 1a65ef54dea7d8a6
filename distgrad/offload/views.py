"""What an offloaded tensor is made of: a span of memory, and a view into it.

A saved tensor is often a view (a transpose, a slice) of an array that other saved
tensors view as well. Offloading stores the *memory* once: the span of bytes the
view touches inside its root array (the ndarray at the end of its ``.base``
chain), and each saved tensor keeps its own view metadata (dtype, shape, strides,
offset into the span). So ``x`` and ``x.t()`` saved by two ops are written once and
come back as two views of one buffer, each with its own strides: not one copy
handed to both (the dedup-by-address bug that gives the transpose the wrong
layout).

Deduplication is keyed by the root array *object*, held weakly: when the root is
freed its entry goes with it, so a new array that NumPy places at the old address
is never mistaken for the old one. The key also holds the tensor's version
counter and version, so a buffer modified in place between two saves is stored
again, not shared.
"""
import weakref

import numpy as np

try:
    from numpy.lib.array_utils import byte_bounds as _byte_bounds
except ImportError:  # NumPy < 2
    _byte_bounds = np.byte_bounds

__all__ = ["Span", "ViewMeta", "span_of", "DedupTable"]

#: A view whose span is this much larger than its own bytes (every 4th row, say) is
#: stored compact, as a contiguous copy of its elements, instead of its whole span.
SPARSE_FACTOR = 2


class _Memory:
    """Exposes raw bytes to NumPy while keeping the array that owns them alive."""

    __slots__ = ("__array_interface__", "owner")

    def __init__(self, address, nbytes, owner):
        self.__array_interface__ = {"data": (address, True), "shape": (nbytes,),
                                    "typestr": "|u1", "version": 3}
        self.owner = owner


class ViewMeta:
    """How one saved tensor views its stored span."""

    __slots__ = ("dtype", "shape", "strides", "offset")

    def __init__(self, dtype, shape, strides, offset):
        self.dtype, self.shape, self.strides, self.offset = dtype, shape, strides, offset

    def rebuild(self, payload):
        """The saved array as a read-only view of ``payload`` (the span's bytes)."""
        out = np.ndarray(self.shape, self.dtype, buffer=payload, offset=self.offset,
                         strides=self.strides)
        out.flags.writeable = False
        return out


class Span:
    """The bytes to store for one saved array and, for dedup, where they live.

    ``payload`` is a read-only uint8 view of the memory (it keeps the root alive
    until the bytes are stored); ``lo``/``hi`` are absolute addresses of the span,
    ``align`` is ``lo`` mod 64. A compact span is a copy, not shared with other views.
    """

    __slots__ = ("root", "lo", "hi", "payload", "compact")

    @property
    def nbytes(self):
        return self.hi - self.lo


def memory_root(array):
    """The ndarray at the end of ``array``'s ``.base`` chain (the owner of the memory)."""
    while isinstance(array.base, np.ndarray):
        array = array.base
    return array


def span_of(array):
    """Return ``(span, view_meta)`` for a saved ndarray."""
    span = Span()
    span.root = memory_root(array)
    lo, hi = _byte_bounds(array)
    span.compact = hi - lo > SPARSE_FACTOR * array.nbytes + 4096
    if span.compact:
        data = np.ascontiguousarray(array)
        span.lo, span.hi = data.ctypes.data, data.ctypes.data + data.nbytes
        span.payload = data.reshape(-1).view(np.uint8)
        meta = ViewMeta(array.dtype, array.shape, data.strides, 0)
    else:
        span.lo, span.hi = lo, hi
        span.payload = np.asarray(_Memory(lo, hi - lo, span.root))
        meta = ViewMeta(array.dtype, array.shape, array.strides, array.ctypes.data - lo)
    return span, meta


class _RootEntry:
    __slots__ = ("ref", "records")


class DedupTable:
    """Stored spans by root array, so the same memory saved twice is stored once.

    Records put here need attributes ``lo``, ``hi``, ``vc`` and ``version``. The
    caller serialises :meth:`find`, :meth:`add` and :meth:`discard`; the entry of a
    freed root is dropped from whatever thread frees it, without a lock.
    """

    def __init__(self):
        self._by_root = {}

    def __len__(self):
        return len(self._by_root)

    def find(self, span, vc, version):
        """A stored record covering ``span``'s bytes at the same version, or None."""
        if span.compact:
            return None
        entry = self._by_root.get(id(span.root))
        if entry is None or entry.ref() is not span.root:
            return None
        for rec in entry.records:
            if rec.vc is vc and rec.version == version and rec.lo <= span.lo \
                    and span.hi <= rec.hi:
                return rec
        return None

    def add(self, span, record):
        if span.compact:
            return
        key = id(span.root)
        entry = self._by_root.get(key)
        if entry is None or entry.ref() is not span.root:
            entry = _RootEntry()
            table = self._by_root

            def forget(_ref, key=key, entry=entry, table=table):
                if table.get(key) is entry:
                    del table[key]
            entry.ref = weakref.ref(span.root, forget)
            entry.records = []
            self._by_root[key] = entry
        entry.records.append(record)
        record.root_key = key

    def discard(self, record):
        key = getattr(record, "root_key", None)
        entry = self._by_root.get(key) if key is not None else None
        if entry is not None and record in entry.records:
            entry.records.remove(record)
            if not entry.records:
                del self._by_root[key]

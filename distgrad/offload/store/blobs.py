"""The store's memory: blobs by (client, namespace, key), a byte budget, spill to disk.

Blobs are kept as they arrived (read-only arrays over the received frames, no
copy) until ``memory_bytes`` is used; past it the blobs put *earliest* move to
record files (checksummed, in a per-run directory swept after a crash): backward
asks for the latest first, so the oldest are needed last. A put that fits
neither in memory nor under ``spill_bytes`` is refused with a message saying so.
"""
import itertools
import os
from collections import OrderedDict

from ...utils.tempdirs import owned_tempdir
from ..errors import StoreError
from ..records import read_record, write_record

_namespaces = itertools.count(1)


def new_namespace():
    """A namespace name no other client of a store uses: this process's pid and a count."""
    return f"{os.getpid()}-{next(_namespaces)}"

__all__ = ["BlobStore", "SPILL_DIR_PREFIX"]

SPILL_DIR_PREFIX = "distgrad-store-"
#: Bookkeeping charged per blob, so a flood of empty blobs still meets the budget.
BLOB_OVERHEAD = 256


class BlobStore:
    """Blobs in memory up to ``memory_bytes``, then on disk up to ``spill_bytes``
    (``None``: unbounded; ``0``: no spilling). Not thread-safe: one owner thread.

    >>> import numpy as np
    >>> s = BlobStore(memory_bytes=1 << 20)
    >>> s.put("client", "ctx1", 7, np.arange(4, dtype=np.uint8))
    >>> s.get("client", "ctx1", 7).tolist()
    [0, 1, 2, 3]
    >>> s.release("client", "ctx1")
    1
    >>> s.close()
    """

    def __init__(self, memory_bytes, spill_directory=None, spill_bytes=None, name="store"):
        if memory_bytes < 0:
            raise ValueError(f"memory_bytes must be >= 0, got {memory_bytes}")
        if spill_bytes is not None and spill_bytes < 0:
            raise ValueError(f"spill_bytes must be >= 0 or None, got {spill_bytes}")
        self.name = name
        self.memory_bytes = int(memory_bytes)
        self.spill_bytes = spill_bytes
        self._spill_root = spill_directory
        self._spill_dir = None
        self._memory = OrderedDict()   # (client, ns, key) -> blob, oldest first
        self._spilled = {}             # (client, ns, key) -> RecordInfo
        self._by_client = {}           # client -> set of (client, ns, key)
        self._mem_used = 0
        self._disk_used = 0
        self._names = itertools.count()
        self.counters = {"puts": 0, "gets": 0, "spilled": 0, "refused": 0}

    def _cost(self, n):
        return n + BLOB_OVERHEAD

    # ------------------------------------------------------------ operations
    def put(self, client, ns, key, blob):
        k = (client, ns, key)
        self._drop(k)
        cost = self._cost(blob.nbytes)
        if cost > self.memory_bytes:
            self._spill_one(k, blob)  # larger than all memory: straight to disk
        else:
            while self._mem_used + cost > self.memory_bytes:
                old_key, old_blob = next(iter(self._memory.items()))
                self._spill_one(old_key, old_blob)
                del self._memory[old_key]
                self._mem_used -= self._cost(old_blob.nbytes)
            self._memory[k] = blob
            self._mem_used += cost
        self._by_client.setdefault(client, set()).add(k)
        self.counters["puts"] += 1

    def _spill_one(self, k, blob):
        if self.spill_bytes is not None and self._disk_used + blob.nbytes > self.spill_bytes:
            self.counters["refused"] += 1
            raise StoreError(
                f"activation store {self.name} is full: {self._mem_used} bytes in memory "
                f"(budget {self.memory_bytes}) and {self._disk_used} on disk "
                f"(limit {self.spill_bytes}); a blob of {blob.nbytes} bytes does not fit")
        if self._spill_dir is None:
            self._spill_dir = owned_tempdir(SPILL_DIR_PREFIX, root=self._spill_root)
        path = os.path.join(self._spill_dir, f"{next(self._names)}.rec")
        try:
            self._spilled[k] = write_record(path, repr(k[1:]), blob)
        except OSError as e:
            raise StoreError(f"activation store {self.name} could not spill to {path}: {e}") \
                from None
        self._disk_used += blob.nbytes
        self.counters["spilled"] += 1

    def get(self, client, ns, key):
        k = (client, ns, key)
        self.counters["gets"] += 1
        blob = self._memory.get(k)
        if blob is not None:
            return blob
        info = self._spilled.get(k)
        if info is None:
            raise StoreError(f"activation store {self.name} has no blob {key!r} in namespace "
                             f"{ns!r} for this client (never stored, or already freed)")
        return read_record(info)

    def delete(self, client, ns, key):
        k = (client, ns, key)
        if self._drop(k):
            keys = self._by_client.get(client)
            if keys is not None:
                keys.discard(k)
                if not keys:
                    del self._by_client[client]

    def release(self, client, ns):
        """Delete every blob of ``client`` in namespace ``ns``; return how many."""
        keys = [k for k in self._by_client.get(client, ()) if k[1] == ns]
        for k in keys:
            self.delete(*k)
        return len(keys)

    def drop_client(self, client):
        """Delete everything ``client`` stored (it said bye, disconnected or died)."""
        keys = self._by_client.pop(client, set())
        for k in keys:
            self._drop(k)
        return len(keys)

    def _drop(self, k):
        blob = self._memory.pop(k, None)
        if blob is not None:
            self._mem_used -= self._cost(blob.nbytes)
            return True
        info = self._spilled.pop(k, None)
        if info is not None:
            self._disk_used -= info.nbytes
            try:
                os.unlink(info.path)
            except FileNotFoundError:
                pass
            return True
        return False

    def stats(self, client=None):
        out = {"memory_used": self._mem_used, "memory_bytes": self.memory_bytes,
               "disk_used": self._disk_used, "blobs_in_memory": len(self._memory),
               "blobs_on_disk": len(self._spilled), "clients": len(self._by_client),
               **self.counters}
        if client is not None:
            out["client_blobs"] = len(self._by_client.get(client, ()))
        return out

    def close(self):
        for client in list(self._by_client):
            self.drop_client(client)
        if self._spill_dir is not None:
            import shutil
            shutil.rmtree(self._spill_dir, ignore_errors=True)
            self._spill_dir = None

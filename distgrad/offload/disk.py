"""The disk tier: record files in a per-run directory, written behind the forward pass.

The directory is ``<dir>/distgrad-offload-<pid>-XXXX``, made by
:func:`distgrad.utils.tempdirs.owned_tempdir`: a process killed before it could
clean up leaves it behind, and the next one to make such a directory in the same
place sweeps it (the same mechanism as the RPC layer's ipc directories). A
normally ending process removes its own at exit.

One writer thread per tier writes the files in put order; reads happen in the
caller's thread (the prefetcher's, ahead of backward). ``read="read"`` (the
default) reads into a fresh buffer with ``preadv`` and checks the checksum on
that private copy; ``read="mmap"`` maps the file (``MAP_POPULATE``, so pages come
in at once, not faulted one by one in backward) and checks the mapping.
Mapping measures faster (``scripts/bench_offload.py`` prints both: about 4 vs 6
ms per 8 MiB from the page cache on the reference machine), but read-ahead
hides the difference in a step, and only a private copy keeps the promise that
a record changed on disk is an error and never a wrong gradient: a mapped file
overwritten after its check would change the tensor under backward, and one
truncated would kill the process with SIGBUS.
"""
import atexit
import itertools
import os
import queue
import shutil
import threading
import weakref

from ..utils.lifetimes import join_all
from ..utils.tempdirs import owned_tempdir
from .errors import OffloadError
from .records import read_record, write_record
from .tier import Tier

__all__ = ["DiskTier", "RUN_DIR_PREFIX"]

#: Name prefix of per-run directories (the owner's pid follows it).
RUN_DIR_PREFIX = "distgrad-offload-"
READ_MODES = ("read", "mmap")

_live_dirs = weakref.WeakValueDictionary()


@atexit.register
def _remove_run_dirs():
    for tier in list(_live_dirs.values()):
        tier.close()


class DiskTier(Tier):
    """Offloaded bytes as files under ``directory`` (default: the system temp dir).

    >>> tier = DiskTier()
    >>> import numpy as np
    >>> _ = tier.put(1, np.arange(8, dtype=np.uint8))
    >>> tier.get(1).tolist()
    [0, 1, 2, 3, 4, 5, 6, 7]
    >>> tier.close()
    """

    def __init__(self, directory=None, *, read="read", max_inflight_bytes=64 << 20):
        super().__init__(max_inflight_bytes)
        if read not in READ_MODES:
            raise ValueError(f"read must be one of {READ_MODES}, not {read!r}")
        if directory is not None and not os.path.isdir(directory):
            raise ValueError(f"directory {directory!r} does not exist")
        self.read_mode = read
        self.where = owned_tempdir(RUN_DIR_PREFIX, root=directory)
        self._index = {}          # key -> RecordInfo, once written
        self._index_lock = threading.Lock()
        self._names = itertools.count()
        self._queue = queue.SimpleQueue()
        self._writer = threading.Thread(target=self._write_loop, name="distgrad-offload-writer",
                                        daemon=True)
        self._writer.start()
        _live_dirs[id(self)] = self

    def describe(self):
        return f"disk tier {self.where}"

    def _start_put(self, key, payload):
        self._queue.put((key, payload))

    def _write_loop(self):
        while True:
            item = self._queue.get()
            if item is None:
                return
            key, payload = item
            del item
            if self._closed or self._was_cancelled(key):
                self._stored(key, OffloadError(f"{self.describe()} was closed"))
                continue
            path = os.path.join(self.where, f"{next(self._names)}.rec")
            try:
                info = write_record(path, key, payload, align=payload.ctypes.data)
            except OSError as e:
                self._stored(key, OffloadError(f"could not write offloaded record {path}: {e}"))
                continue
            finally:
                del payload
            with self._index_lock:
                self._index[key] = info
            self._stored(key)

    def _read(self, key, align):
        with self._index_lock:
            info = self._index.get(key)
        if info is None:
            raise OffloadError(f"{self.describe()} has no record {key!r} (already freed)")
        return read_record(info, use_mmap=self.read_mode == "mmap")

    def _remove(self, key):
        with self._index_lock:
            info = self._index.pop(key, None)
        if info is not None:
            try:
                os.unlink(info.path)
            except FileNotFoundError:
                pass

    def files(self):
        """Paths of the record files currently on disk (for tests and reports)."""
        try:
            return sorted(os.path.join(self.where, n) for n in os.listdir(self.where))
        except FileNotFoundError:
            return []

    def close(self):
        """Stop the writer and remove the run directory with whatever is left in it."""
        if self._closed:
            return
        super().close()
        self._queue.put(None)
        join_all([self._writer], 10.0, f"disk tier {self.where}")  # (not itself)
        shutil.rmtree(self.where, ignore_errors=True)
        with self._index_lock:
            self._index.clear()
        _live_dirs.pop(id(self), None)

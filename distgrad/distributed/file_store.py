"""``FileStore``: a key-value store in a file, as ``torch.distributed.FileStore``.

Processes that can open the same file (one machine, or a shared file system) share
the store by its name; nobody serves it. ``init_process_group(init_method="file://
/path")`` meets through one. Every operation takes an exclusive ``flock`` on the
file, reads the table, applies the operation (the same table code as the other
stores) and writes the table back if it changed; ``get``/``wait`` poll the file
until their keys exist or the timeout passes. Each ``FileStore`` object counts
itself as a user of the file (in a hidden key); as in PyTorch, the file is removed
when no user has it open any more and ``world_size`` users have closed it (never
with ``world_size=-1``), so a rank that finishes early does not pull the file from
under one that has not opened it yet.

>>> import os, tempfile
>>> path = os.path.join(tempfile.mkdtemp(), "store")
>>> a, b = FileStore(path, 2), FileStore(path, 2)
>>> a.set("x", "1"), b.add("n", 2), a.add("n", 3), b.get("x")
(None, 2, 5, b'1')
>>> a.close(); b.close(); os.path.exists(path)
False
"""
import os
import time
from contextlib import contextmanager

from ..utils import file_table
from .errors import DistStoreError
from .store import (_FINISHED_KEY, _MEMBERS_KEY, Store, _apply, _Table, _timeout_error,
                    _waits_for)

__all__ = ["FileStore"]

_POLL = 0.01          # how often a waiting get/wait reads the file again
_READ_ONLY = frozenset({"get", "wait", "check", "num_keys", "list_keys", "multi_get"})


class FileStore(Store):
    """The store in ``file_name`` (created if missing); ``world_size`` is the number of
    processes expected to use it (-1: not checked)."""

    def __init__(self, file_name, world_size=-1):
        super().__init__()
        if not isinstance(file_name, (str, os.PathLike)) or not os.fspath(file_name):
            raise ValueError(f"FileStore(): file_name must be a path, not {file_name!r}")
        self.path = os.fspath(file_name)
        self.world_size = world_size
        try:
            self._fd = file_table.open_table(self.path)
        except OSError as e:
            raise DistStoreError(f"FileStore cannot open {self.path!r}: {e}") from None
        self._call("add", _MEMBERS_KEY, 1)  # one more user (a hidden key)

    # -- the file --
    @contextmanager
    def _locked(self):
        if self._fd is None:
            raise DistStoreError(f"FileStore {self.path!r} is closed")
        with file_table.locked(self._fd):
            yield

    def _read(self):
        table = _Table()
        try:
            table.data = file_table.read(self._fd)
        except ValueError as e:  # name the file, not msgpack's internals
            raise DistStoreError(f"FileStore {self.path!r} does not hold a store ({e})") from None
        return table

    def _write(self, table):
        file_table.write(self._fd, table.data)

    # -- the store API --
    def _call(self, op, *args):
        keys, timeout = _waits_for(op, args)
        deadline = time.monotonic() + timeout if keys is not None and timeout > 0 else None
        while True:
            with self._locked():
                table = self._read()
                missing = table.missing(keys) if keys is not None else []
                if not missing:
                    result = _apply(table, op, args)
                    if op not in _READ_ONLY:
                        self._write(table)
                    return result
            if deadline is not None and time.monotonic() >= deadline:
                raise _timeout_error(missing, timeout)
            time.sleep(_POLL)

    def close(self):
        """Stop using the store; the last of ``world_size`` users removes its file."""
        if self._fd is None:
            return
        try:
            with self._locked():
                table = self._read()
                finished = table.add(_FINISHED_KEY, 1)
                if table.add(_MEMBERS_KEY, -1) <= 0 and 0 <= self.world_size <= finished:
                    os.unlink(self.path)
                else:
                    self._write(table)
        except (OSError, DistStoreError):
            pass  # removed or rewritten by someone else: nothing of ours is left in it
        self._close_fd()

    def _close_fd(self):
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)

    def __del__(self):
        try:
            self.close()
        except Exception:  # noqa: BLE001 - never raise from a finalizer
            pass

    def __repr__(self):
        return f"FileStore({self.path!r}, world_size={self.world_size})"

"""A table of keys and values in a file, changed under an exclusive ``flock``: what a
``file://`` init method meets through (``FileStore``'s keys and the RPC rendezvous's
record share one file, so ``init_process_group`` and ``init_rpc`` can be given the same
``file:///path``, as in PyTorch where both are ``FileStore``\\s).

The file is msgpack of one map, created with mode 0600 (only its owner reads what it
holds: a world's secret may be one of its values). Every change is read, modify, write
under the lock; readers take the same lock, so nobody sees half a table.
"""
import fcntl
import os
import stat
from contextlib import contextmanager

import msgpack

__all__ = ["open_table", "locked", "read", "write", "is_private"]


def open_table(path, create=True):
    """A descriptor of the table at ``path`` (created, mode 0600, if ``create``); raises
    OSError (FileNotFoundError when it does not exist and ``create`` is False)."""
    flags = os.O_RDWR | os.O_CLOEXEC | (os.O_CREAT if create else 0)
    return os.open(path, flags, 0o600)


@contextmanager
def locked(fd):
    fcntl.flock(fd, fcntl.LOCK_EX)
    try:
        yield
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)


def read(fd):
    """The table (a dict) in ``fd``, under its lock; ValueError when the file holds
    something else."""
    size = os.fstat(fd).st_size
    if not size:
        return {}
    raw = os.pread(fd, size, 0)
    try:
        data = msgpack.unpackb(raw, raw=False)
    except Exception as e:  # noqa: BLE001 - the callers name the file
        raise ValueError(f"{type(e).__name__}: {e}") from None
    if type(data) is not dict:
        raise ValueError(f"a msgpack {type(data).__name__}, not a map")
    return data


def write(fd, data):
    raw = msgpack.packb(data, use_bin_type=True)
    os.ftruncate(fd, 0)
    os.pwrite(fd, raw, 0)


def is_private(path):
    """Whether only this file's owner can read it (True for a file not made yet: it will be
    made with mode 0600)."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        return True
    return not mode & (stat.S_IRWXG | stat.S_IRWXO)


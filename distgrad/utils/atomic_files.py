"""Files that readers see whole: written beside their place, made durable, renamed in.

>>> import os, tempfile
>>> with tempfile.TemporaryDirectory() as d:
...     path = os.path.join(d, "state.bin")
...     with atomic_write(path) as fh:
...         _ = fh.write(b"all or nothing")
...     print(open(path, "rb").read(), os.listdir(d))
b'all or nothing' ['state.bin']
"""
import os
from contextlib import contextmanager

__all__ = ["atomic_write"]


@contextmanager
def atomic_write(path, *, sync=True, tag=""):
    """A binary file to write ``path`` through: a temporary file beside it (``tag`` tells
    concurrent writers of one path apart), renamed to ``path`` when the body succeeds, so
    readers see the old file or the whole new one; removed when the body raises. With
    ``sync`` the file and then its directory are flushed to disk (the rename is durable
    only once the directory is)."""
    path = os.fspath(path)
    directory = os.path.dirname(path) or "."
    tmp = os.path.join(directory, f".{os.path.basename(path)}.tmp-{os.getpid()}{tag}")
    try:
        with open(tmp, "wb") as fh:
            yield fh
            if sync:
                fh.flush()
                os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    if sync:
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

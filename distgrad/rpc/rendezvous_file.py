"""``init_method="file:///path"`` for ``init_rpc`` (PyTorch's file init, for processes that
share a file system): rank 0 binds a free port and writes where its rendezvous runs into
the file (:func:`publish`); the others wait for it there (:func:`read_published`); rank 0
takes it out when it shuts down (:func:`unpublish`).

The file is a table (``utils/file_table.py``) that ``init_process_group``'s
``FileStore`` uses too: one ``file:///path`` can serve both, in either order. The
record sits under a hidden key and says who wrote it (pid, boot of the host), so a file
an earlier run left behind is named as such instead of sending the ranks to a dead
address; as with PyTorch's, each run needs a file no earlier run left behind.

The file is made with mode 0600, which makes it a place to hand the world's secret, as
Jupyter's connection files do: where rank 0 has no secret (no ``DISTGRAD_WORLD_SECRET``)
and the file is private, rank 0 makes one and writes it beside the address, and the
others take it from there. Whoever can read the file (its owner, and root, also on
another host of a shared file system) can join the world; nobody else can. A secret
given to every process is never written into the file.
"""
import os
import time
import urllib.parse

import msgpack

from ..utils import file_table
from ..utils.host import boot_id
from ..utils.tempdirs import pid_alive
from .errors import RpcTimeoutError
from .rendezvous import RendezvousError

__all__ = ["file_path", "keeps_secret", "publish", "read_published", "unpublish"]

#: The record's key in the file's table (hidden from a FileStore's list_keys).
KEY = "\x00distgrad.rpc.rendezvous"
_POLL = 0.02  # s between two looks at a file that holds no record yet


def file_path(init_method):
    """The file of a ``file://`` init method; None for the other kinds."""
    if not (init_method or "").startswith("file://"):
        return None
    url = urllib.parse.urlparse(init_method)
    path = url.netloc + url.path
    if not path:
        raise ValueError(f"init_method {init_method!r} names no file: use file:///path")
    return path


def keeps_secret(path):
    """Whether the file at ``path`` may hold the world's secret (only its owner reads it)."""
    return file_table.is_private(path)


def _writer(record):
    pid, boot = record.get("pid"), record.get("boot")
    if boot == boot_id():
        state = "still running" if pid_alive(pid) else "gone"
        return f"pid {pid} on this host, {state}", state == "gone"
    return f"pid {pid} on another host", False


def _record(table, path):
    raw = table.get(KEY)
    if raw is None:
        return None
    try:
        record = msgpack.unpackb(raw, raw=False)
        if type(record) is not dict or type(record.get("address")) is not str:
            raise ValueError("not a rendezvous record")
    except Exception:  # noqa: BLE001
        raise RendezvousError(f"the rendezvous file {path!r} holds a malformed record: "
                              "remove it") from None
    return record


def _table(path, fd):
    try:
        return file_table.read(fd)
    except ValueError as e:
        raise RendezvousError(f"{path!r} is not a rendezvous file ({e}): give init_method a "
                              "file of its own") from None


def publish(path, address, secret=None):
    """Rank 0: write ``address`` (and ``secret``, bytes, when rank 0 made it) into ``path``.
    A record already there (an earlier run's, or another world's) is refused, named."""
    try:
        fd = file_table.open_table(path)
    except OSError as e:
        raise RendezvousError(f"cannot write the rendezvous address into {path!r}: {e}") from None
    try:
        with file_table.locked(fd):
            table = _table(path, fd)
            old = _record(table, path)
            if old is not None:
                who, gone = _writer(old)
                why = ("left behind by an earlier run" if gone else
                       "in use by the rank 0 of another world")
                raise RendezvousError(
                    f"the rendezvous file {path!r} holds an address already ({old['address']}, "
                    f"written by {who}): {why}. Each run needs a file no earlier run left "
                    "behind: remove it, or give init_method another file")
            record = {"address": address, "pid": os.getpid(), "boot": boot_id()}
            if secret is not None:
                record["secret"] = secret.decode() if isinstance(secret, bytes) else secret
            table[KEY] = msgpack.packb(record)
            file_table.write(fd, table)
    finally:
        os.close(fd)


def read_published(path, timeout):
    """(address, secret or None) rank 0 wrote into ``path``, waiting up to ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while True:
        record = None
        try:
            fd = file_table.open_table(path, create=False)
        except FileNotFoundError:
            pass
        except OSError as e:
            raise RendezvousError(f"cannot read the rendezvous file {path!r}: {e}") from None
        else:
            try:
                with file_table.locked(fd):
                    record = _record(_table(path, fd), path)
            finally:
                os.close(fd)
        if record is not None:
            who, gone = _writer(record)
            if gone:
                raise RendezvousError(
                    f"the rendezvous file {path!r} was left behind by an earlier run (its "
                    f"rank 0, {who}): remove it and start again")
            secret = record.get("secret")
            return record["address"], secret.encode() if type(secret) is str else None
        if time.monotonic() >= deadline:
            raise RpcTimeoutError(f"no rendezvous address appeared in {path!r} within "
                                  f"{timeout:g} s: is rank 0 running with the same "
                                  "init_method? (rendezvous_timeout, --rendezvous-timeout)")
        time.sleep(_POLL)


def unpublish(path, address):
    """Rank 0 at shutdown: take its record out of ``path``; remove the file if nothing else
    (a process group's FileStore) is kept in it."""
    try:
        fd = file_table.open_table(path, create=False)
    except OSError:
        return
    try:
        with file_table.locked(fd):
            table = file_table.read(fd)
            record = table.get(KEY)
            if record is None or msgpack.unpackb(record, raw=False).get("address") != address:
                return
            del table[KEY]
            if table:
                file_table.write(fd, table)
            else:
                os.unlink(path)
    except Exception:  # noqa: BLE001 - rewritten or removed by someone else: nothing of ours
        pass          # is left in it
    finally:
        os.close(fd)

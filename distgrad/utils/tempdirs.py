"""Temp files and directories owned by a process, and the sweeping of those whose owner died.

A process that crashes cannot remove what it made: its ipc:// socket directory,
its offloaded activations, its shared-memory segments. Each such path's name
carries its owner's pid (``<prefix><pid>-...``); whoever makes a new one first
removes the paths of owners that are gone, so nothing piles up in /tmp or
/dev/shm. A program that simply ends without closing what made them (no
``rpc.shutdown()`` or ``destroy_process_group()``, as many PyTorch programs do)
has its directories removed when the interpreter exits.
"""
import atexit
import os
import re
import shutil
import tempfile
import threading

__all__ = ["owned_tempdir", "owned_name", "sweep_stale", "pid_alive", "remove_path"]


def pid_alive(pid):
    """Whether a process with this pid exists (of any user)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        return True
    return True


def sweep_stale(prefix, root=None):
    """Remove ``<root>/<prefix><pid>-*`` files and directories whose owner has exited."""
    root = root or tempfile.gettempdir()
    pattern = re.compile(re.escape(prefix) + r"(\d+)-")
    try:
        names = os.listdir(root)
    except OSError:
        return
    for name in names:
        m = pattern.match(name)
        if m and not pid_alive(int(m.group(1))):
            remove_path(os.path.join(root, name))


def remove_path(path):
    """Remove a file or a directory tree; quietly, if it is already gone."""
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path, ignore_errors=True)
    else:
        try:
            os.unlink(path)
        except OSError:
            pass


def owned_name(prefix):
    """The name prefix of a path this process owns: ``<prefix><pid>-``."""
    return f"{prefix}{os.getpid()}-"


_made = {}  # path -> pid of the process that made it, for the exit handler
_made_lock = threading.Lock()


def owned_tempdir(prefix, root=None):
    """A new temp directory named after this process, after sweeping dead owners' ones;
    removed at interpreter exit if its user has not removed it by then."""
    sweep_stale(prefix, root)
    path = tempfile.mkdtemp(prefix=owned_name(prefix), dir=root)
    with _made_lock:
        for old in [p for p in _made if not os.path.exists(p)]:  # closed by their users
            del _made[old]
        _made[path] = os.getpid()
    return path


@atexit.register
def _remove_own_at_exit():
    # Only the maker's: a forked child inherits this handler and its parent's table.
    me = os.getpid()
    with _made_lock:
        paths = [p for p, pid in _made.items() if pid == me]
        _made.clear()
    for path in paths:
        remove_path(path)

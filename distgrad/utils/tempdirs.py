"""Temp directories owned by a process, and the clean-up of those whose owner died.

A process that crashes cannot remove its ipc:// socket directory. Each
directory's name carries its owner's pid; whoever makes a new one first removes
the directories of owners that are gone, so nothing piles up in /tmp.
"""
import os
import re
import shutil
import tempfile

__all__ = ["owned_tempdir", "sweep_stale"]


def _alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        return True
    return True


def sweep_stale(prefix, root=None):
    """Remove ``<root>/<prefix><pid>-*`` directories whose owner process has exited."""
    root = root or tempfile.gettempdir()
    pattern = re.compile(re.escape(prefix) + r"(\d+)-")
    try:
        names = os.listdir(root)
    except OSError:
        return
    for name in names:
        m = pattern.match(name)
        if m and not _alive(int(m.group(1))):
            shutil.rmtree(os.path.join(root, name), ignore_errors=True)


def owned_tempdir(prefix, root=None):
    """A new temp directory named after this process, after sweeping dead owners' ones."""
    sweep_stale(prefix, root)
    return tempfile.mkdtemp(prefix=f"{prefix}{os.getpid()}-", dir=root)

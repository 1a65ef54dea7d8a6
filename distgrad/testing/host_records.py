"""What simulated hosts made, written down so that it can be removed whoever dies.

Each :class:`~distgrad.testing.hosts.SimulatedHosts` keeps a record (a JSON file in the
registry directory, named by its prefix): its owner's pid, its namespaces, the
directories it made (``/etc/netns/*``, private ``/dev/shm``, call results) and the link
into the caller's namespace. :func:`remove` undoes a record; a guardian process
(:func:`guard_in_background`) does it when its owner dies without closing, and
:func:`sweep` removes records whose owner is gone (the machine lost power, a guardian
was killed too).
"""
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

__all__ = ["ip", "registry_dir", "remove", "listed", "sweep", "guard_in_background"]

_REGISTRY_ROOTS = ("/run/distgrad-hosts",)


def ip(args, netns=None, check=True, input=None):
    """Run ``ip args`` (in namespace ``netns``); OSError naming the command if it fails
    and ``check``."""
    cmd = ["ip"] + (["-n", netns] if netns else []) + list(args)
    done = subprocess.run(cmd, capture_output=True, text=True, input=input, timeout=30)
    if check and done.returncode != 0:
        raise OSError(f"simulated hosts: `{' '.join(cmd)}` failed: {done.stderr.strip()}")
    return done


def registry_dir():
    """Where the records are kept (``/run`` where writable: it empties at boot)."""
    for root in _REGISTRY_ROOTS:
        try:
            os.makedirs(root, exist_ok=True)
            if os.access(root, os.W_OK):
                return root
        except OSError:
            continue
    root = os.path.join(tempfile.gettempdir(), "distgrad-hosts")
    os.makedirs(root, exist_ok=True)
    return root


def remove(record):
    """Remove what ``record`` lists: processes in its namespaces first, then the rest."""
    namespaces = record.get("namespaces", [])
    for _ in range(3):
        pids = []
        for ns in namespaces:
            pids += ip(["netns", "pids", ns], check=False).stdout.split()
        if not pids:
            break
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, ValueError):
                os.kill(int(pid), signal.SIGKILL)
        time.sleep(0.05)
    if record.get("root_link"):
        ip(["link", "del", record["root_link"]], check=False)
    for ns in reversed(namespaces):
        ip(["netns", "del", ns], check=False)
    for path in record.get("etc", []) + record.get("shm", []) + record.get("tmp", []):
        shutil.rmtree(path, ignore_errors=True)


def listed():
    """The prefixes of the simulated hosts on this machine."""
    return sorted(n[:-5] for n in os.listdir(registry_dir()) if n.endswith(".json"))


def sweep(prefix=None):
    """Remove the simulated hosts whose owner is gone (or, with ``prefix``, those hosts,
    whoever made them). Returns the prefixes removed."""
    root = registry_dir()
    removed = []
    for name in sorted(os.listdir(root)):
        if not name.endswith(".json"):
            continue
        path = os.path.join(root, name)
        try:
            with open(path) as fh:
                record = json.load(fh)
        except (OSError, ValueError):
            continue
        owner = record.get("owner")
        mine = prefix is not None and name[:-5] == prefix
        if mine or (prefix is None and owner is not None and not _alive(owner)):
            remove(record)
            with contextlib.suppress(OSError):
                os.unlink(path)
            removed.append(name[:-5])
    return removed


def _alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def guard_in_background(record_path):
    """A process that waits for EOF on a pipe from this one, then removes what the record
    lists: the hosts go also when this process is killed."""
    return subprocess.Popen([sys.executable, "-c",
                             "import sys; from distgrad.testing.host_records import _guard; "
                             "_guard(sys.argv[1])", record_path],
                            stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True, close_fds=True)


def _guard(record_path):
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    sys.stdin.buffer.read()  # returns at EOF: the owner closed the pipe or died
    try:
        with open(record_path) as fh:
            record = json.load(fh)
    except (OSError, ValueError):
        return  # the owner cleaned up
    remove(record)
    with contextlib.suppress(OSError):
        os.unlink(record_path)

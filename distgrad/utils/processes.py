"""Child processes that cannot outlive their parent, and reaping the ones we started.

A child calls :func:`die_with_parent` first thing: on Linux the kernel then
sends it SIGKILL when the parent exits, however the parent exits (a crash, a
SIGKILL, a test runner's timeout), so nothing is orphaned. Elsewhere the child
must watch its parent itself (``os.getppid()``), as DataLoader workers do. Used by
``multiprocessing.spawn``, DataLoader workers, ``distgrad worker`` and a launch's
coordinator.
The kernel's "parent" is the thread that started the child: start children
from a thread that outlives them (normally the main thread).

:func:`reap` ends a group of children the polite way first: SIGTERM, a grace
period, then SIGKILL for whoever is still there, and joins them all.
"""
import ctypes
import os
import signal
import sys
import time

__all__ = ["die_with_parent", "join_all", "reap"]

_PR_SET_PDEATHSIG = 1


def die_with_parent(parent_pid=None):
    """Ask for SIGKILL when the parent exits (Linux); exit now if it already has.

    ``parent_pid`` is the pid the parent had when it started us: if it exited
    before this call, we were re-parented and the kernel would never tell us.
    Without it, being adopted by init (parent pid 1) is the sign.
    """
    if sys.platform.startswith("linux"):
        try:
            ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
        except (OSError, AttributeError):  # no prctl in this libc: the watchdogs remain
            pass
    orphaned = os.getppid() != parent_pid if parent_pid is not None else os.getppid() == 1
    if orphaned:
        os._exit(1)


def _started(processes):
    return [p for p in processes if p is not None and p.pid is not None]


def join_all(processes, timeout):
    """Join the started processes, all within one ``timeout`` (seconds)."""
    deadline = time.monotonic() + timeout
    for p in _started(processes):
        p.join(max(0.0, deadline - time.monotonic()))


def reap(processes, grace_period=30.0):
    """Terminate the live ``multiprocessing.Process`` objects, wait up to
    ``grace_period`` seconds, kill whoever remains, and join every one."""
    started = _started(processes)
    for p in started:
        if p.is_alive():
            p.terminate()
    join_all(started, grace_period)
    for p in started:
        if p.is_alive():
            p.kill()
    for p in started:
        p.join()

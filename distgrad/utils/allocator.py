"""Keep freed memory for reuse in processes that compute on many threads (RPC workers).

glibc's malloc gives each thread that allocates an arena of its own. Memory freed in an
arena that is not the main one goes back to the kernel as soon as the arena's top is
free (``heap_trim``), and a large block (above a threshold that adapts only for the
main arena) comes from ``mmap`` and goes back on ``free``. A training step on a handler
thread allocates and frees the same activation-sized arrays over and over, so each one
is a fresh mapping: every page faults and is zeroed again. Measured on a stage of four
1024x1024 layers (4 micro-batches of 64 rows, SGD) run on a new thread each step: 876
page faults and 2.8 ms of kernel time per step; 3 and 0.4 ms with the settings below;
on the main thread 0 either way (``scripts/bench_rpc_pipeline.py`` shows what it is
worth end to end).

:func:`keep_freed_memory` raises both thresholds (mallopt), so freed blocks stay in the
process for its next allocations. The cost is memory: a process keeps the peak of what
it allocated rather than shrinking after it. ``DISTGRAD_MALLOC_TUNING=0`` turns it off;
it does nothing where malloc is not glibc's.
"""
import ctypes
import ctypes.util
import os
import sys

__all__ = ["keep_freed_memory", "MMAP_THRESHOLD", "TRIM_THRESHOLD"]

#: Blocks up to this size come from the arenas, larger ones from mmap (glibc's dynamic
#: threshold tops out at the same 32 MiB, but only for the main arena).
MMAP_THRESHOLD = 32 << 20
#: Free memory at an arena's top beyond this goes back to the kernel (a thread's arena
#: is at most 64 MiB, so such arenas are never trimmed).
TRIM_THRESHOLD = 256 << 20

_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # glibc's mallopt parameters
_done = []


def keep_freed_memory():
    """Raise glibc's mmap and trim thresholds once per process; returns whether it did."""
    if _done:
        return _done[0]
    ok = False
    if sys.platform.startswith("linux") and os.environ.get("DISTGRAD_MALLOC_TUNING", "1") != "0":
        try:
            libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
            mallopt = libc.mallopt
        except (OSError, AttributeError):  # not glibc (musl has no mallopt)
            mallopt = None
        if mallopt is not None:
            mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
            ok = bool(mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and \
                bool(mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD))
    _done.append(ok)
    return ok

"""Measuring memory the honest way: the process's resident set, above a baseline.

Peak memory of a step is the peak RSS of the whole process during the step minus
its RSS just before; on Linux the kernel's own high-water mark (``VmHWM``) is
reset first (``/proc/self/clear_refs``), so nothing between samples is missed.
Elsewhere, or where that file is not writable, a sampling thread stands in.
"""
import os
import threading
import time

from ..utils.lifetimes import join_all

__all__ = ["rss_bytes", "PeakMemory", "MemoryTimeline", "MEASURE_ENV"]

_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def rss_bytes():
    """The resident set size of this process now, in bytes."""
    try:
        with open("/proc/self/statm", "rb") as f:
            return int(f.read().split()[1]) * _PAGE
    except OSError:
        import resource
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _hwm_bytes():
    with open("/proc/self/status", "rb") as f:
        for line in f:
            if line.startswith(b"VmHWM:"):
                return int(line.split()[1]) * 1024
    raise OSError("no VmHWM in /proc/self/status")


class PeakMemory:
    """Peak RSS above the RSS at ``start()``, in bytes, as ``stop()`` returns it.

    >>> pm = PeakMemory().start()
    >>> block = bytearray(32 << 20)
    >>> pm.stop() >= 30 << 20
    True
    """

    def __init__(self, interval=0.001):
        self.interval = interval
        self.method = None
        self._sampler = None

    def start(self):
        import gc
        gc.collect()
        self.baseline = rss_bytes()
        try:
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")  # reset VmHWM to the current RSS
            _hwm_bytes()
            self.method = "VmHWM"
        except OSError:
            self.method = "sampling"
            self._sampler = MemoryTimeline(self.interval).start()
        return self

    def stop(self):
        if self.method == "VmHWM":
            peak = _hwm_bytes()
        else:
            samples = self._sampler.stop()
            peak = max([rss for _, rss in samples] + [rss_bytes()])
        return max(0, peak - self.baseline)


class MemoryTimeline:
    """RSS sampled every ``interval`` seconds by a thread: ``[(seconds, bytes), ...]``."""

    def __init__(self, interval=0.005):
        self.interval = interval
        self.samples = []
        self._stop = threading.Event()
        self._thread = None

    def start(self):
        self._t0 = time.perf_counter()
        self._thread = threading.Thread(target=self._run, name="memory-timeline", daemon=True)
        self._thread.start()
        return self

    def _run(self):
        while not self._stop.wait(self.interval):
            self.samples.append((time.perf_counter() - self._t0, rss_bytes()))

    def stop(self):
        self._stop.set()
        join_all([self._thread], 5.0, "memory timeline")
        self.samples.append((time.perf_counter() - self._t0, rss_bytes()))
        return self.samples


#: Environment of a measured child process: compute on one thread (the other core
#: is left to I/O threads), and freed large arrays returned to the OS at once, so
#: that RSS follows live memory (glibc would keep freed multi-MiB blocks in its heap).
MEASURE_ENV = {"OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
               "MALLOC_MMAP_THRESHOLD_": "65536"}

"""``torch.set_num_threads`` / ``torch.get_num_threads``: the threads of one operation.

PyTorch's intra-op threads are, in distgrad, the threads of the BLAS library that
NumPy's matrix products run on (OpenBLAS in NumPy's wheels; MKL and BLIS are
known too). These functions find that library among the ones this process has
loaded and ask it; the rest of distgrad's NumPy code is single-threaded anyway.
Where no known BLAS is loaded, ``set_num_threads`` warns that it has nothing to
set instead of pretending.

>>> import distgrad
>>> n = distgrad.get_num_threads()
>>> distgrad.set_num_threads(1); distgrad.get_num_threads()
1
>>> distgrad.set_num_threads(n)
"""
import ctypes
import os
import threading
import warnings

import numpy as np  # noqa: F401 - loads NumPy's BLAS, the library these functions drive

__all__ = ["get_num_threads", "set_num_threads"]

# (setter, getter) symbol names of the BLAS libraries we know, in the order tried.
_SYMBOLS = (
    ("scipy_openblas_set_num_threads64_", "scipy_openblas_get_num_threads64_"),
    ("scipy_openblas_set_num_threads", "scipy_openblas_get_num_threads"),
    ("openblas_set_num_threads64_", "openblas_get_num_threads64_"),
    ("openblas_set_num_threads", "openblas_get_num_threads"),
    ("MKL_Set_Num_Threads", "MKL_Get_Max_Threads"),
    ("bli_thread_set_num_threads", "bli_thread_get_num_threads"),
)

_lock = threading.Lock()
_blas = None        # [(set, get)] once looked up
_fallback = None    # what get_num_threads reports where no BLAS was found


def _loaded_libraries():
    """Paths of the shared libraries mapped into this process that look like a BLAS."""
    try:
        with open("/proc/self/maps") as fh:
            paths = {line.split(None, 5)[-1].strip() for line in fh if ".so" in line}
    except OSError:  # not Linux: ask NumPy where its BLAS is
        paths = set()
        libs = os.path.join(os.path.dirname(os.path.dirname(np.__file__)), "numpy.libs")
        if os.path.isdir(libs):
            paths = {os.path.join(libs, n) for n in os.listdir(libs)}
    return sorted(p for p in paths if any(k in os.path.basename(p).lower()
                                          for k in ("blas", "mkl", "blis")))


def _find_blas():
    found = []
    for path in _loaded_libraries():
        try:
            lib = ctypes.CDLL(path)
        except OSError:
            continue
        for set_name, get_name in _SYMBOLS:
            setter, getter = getattr(lib, set_name, None), getattr(lib, get_name, None)
            if setter is not None and getter is not None:
                setter.argtypes, setter.restype = [ctypes.c_int], None
                getter.argtypes, getter.restype = [], ctypes.c_int
                found.append((setter, getter))
                break
    return found


def _libraries():
    global _blas
    with _lock:
        if _blas is None:
            _blas = _find_blas()
        return _blas


def _check(name, value):
    if isinstance(value, bool) or not isinstance(value, int):
        raise RuntimeError(f"{name} expects an int, but got {type(value).__name__}")
    if value <= 0:
        raise RuntimeError(f"{name} expects a positive integer")


def set_num_threads(int):  # noqa: A002 - PyTorch's parameter name
    """Sets the number of threads used for intra-op parallelism on CPU (NumPy's BLAS)."""
    global _fallback
    _check("set_num_threads", int)
    libraries = _libraries()
    if not libraries:
        warnings.warn("set_num_threads: no BLAS library that distgrad knows how to set "
                      "(OpenBLAS, MKL, BLIS) is loaded in this process; the number is "
                      "recorded but changes nothing", RuntimeWarning, stacklevel=2)
        _fallback = int
    for setter, _ in libraries:
        setter(int)


def get_num_threads():
    """Returns the number of threads used for intra-op parallelism on CPU (NumPy's BLAS)."""
    libraries = _libraries()
    if libraries:
        return max(1, libraries[0][1]())
    if _fallback is not None:
        return _fallback
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1

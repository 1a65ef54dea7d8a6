"""``torch.set_flush_denormal``: treat subnormal floats as zero on the CPU.

Gradients that shrink toward zero end in subnormal numbers (float32 below 1.2e-38), and
many processors compute on those far more slowly (on an Intel Xeon a 1024-wide MLP's
backward matrix products ran 7-8 times slower once its gradients held them; an AMD EPYC
showed no penalty). With flushing on, the
processor's floating-point control register (MXCSR on x86-64: FTZ and DAZ; FPCR on
AArch64: FZ) makes such inputs and results zero, as PyTorch's switch does, and NumPy's
arithmetic follows, BLAS included.

As in PyTorch, the setting belongs to the calling thread and to the threads it starts
afterwards (a new thread inherits its creator's register): call it before ``init_rpc``
and the RPC threads that run a worker's handlers and its distributed backward flush too;
threads that exist already (a BLAS library's pool started when NumPy loaded, when it
runs more than one thread) keep theirs.

It returns False, changing nothing, where it cannot set the register (another platform
or C library), as PyTorch does where the processor lacks it; the setting is checked by
computing a subnormal product after it is made, and undone if that product is not what
it should be.

>>> import distgrad
>>> distgrad.set_flush_denormal(True)
True
>>> distgrad.tensor([1e-39], dtype=distgrad.float32) * 1.0
tensor([0.])
>>> distgrad.set_flush_denormal(False)
True
>>> float((distgrad.tensor([1e-39], dtype=distgrad.float32) * 1.0)[0]) > 0
True
"""
import ctypes
import ctypes.util
import platform
import sys
import threading

import numpy as np

__all__ = ["set_flush_denormal", "flush_or_raise", "flushing"]

# Where the control register sits in the C library's ``fenv_t`` and which of its bits
# flush, per (system, machine). glibc x86-64: the x87 environment (28 bytes), then
# ``__mxcsr``; macOS x86-64: ``__control``, ``__status``, then ``__mxcsr``; glibc
# AArch64: ``__fpcr`` first; macOS arm64: ``__fpsr`` (8 bytes), then ``__fpcr``.
_FTZ_DAZ = (1 << 15) | (1 << 6)  # MXCSR: flush-to-zero, denormals-are-zero
_FZ = 1 << 24                     # FPCR: flush-to-zero (inputs too, on AArch64)
_LAYOUTS = {
    ("Linux", "x86_64"): (28, _FTZ_DAZ),
    ("Darwin", "x86_64"): (4, _FTZ_DAZ),
    ("Linux", "aarch64"): (0, _FZ),
    ("Darwin", "arm64"): (8, _FZ),
}
_ENV_BYTES = 64  # larger than any fenv_t above
_WORD = 4        # both registers are 32-bit words in fenv_t

_lock = threading.Lock()
_libm = []  # [the C library's fegetenv/fesetenv holder], once looked up


def _library():
    with _lock:
        if not _libm:
            name = ctypes.util.find_library("m") or ctypes.util.find_library("c")
            try:
                _libm.append(ctypes.CDLL(name) if name else None)
            except OSError:
                _libm.append(None)
        return _libm[0]


def _flushes():
    """Whether this thread's arithmetic makes a subnormal float32 zero right now."""
    tiny = np.array([1e-39], dtype=np.float32)  # subnormal: below float32's 1.18e-38
    with np.errstate(all="ignore"):
        return bool((tiny * np.float32(1.0))[0] == 0)


def set_flush_denormal(mode, /):
    """Flush subnormal floats to zero (``mode`` True) or compute with them (False) in this
    thread and the threads it starts from now on; True when the setting was made, False
    where this platform's control register cannot be set (nothing changed). ``mode`` is a
    bool, as PyTorch insists (RuntimeError otherwise: 1 or "yes" are not taken for one)."""
    if type(mode) is not bool:
        t = type(mode)
        name = t.__name__ if t.__module__ == "builtins" else f"{t.__module__}.{t.__name__}"
        raise RuntimeError(f"flush_denormal expects a bool, but got {name}")
    layout = _LAYOUTS.get((platform.system(), platform.machine()))
    libm = _library() if layout is not None and sys.byteorder == "little" else None
    if libm is None:
        return False
    offset, bits = layout
    env = ctypes.create_string_buffer(_ENV_BYTES)
    if libm.fegetenv(env) != 0:
        return False
    saved = env.raw
    word = int.from_bytes(saved[offset:offset + _WORD], "little")
    word = word | bits if mode else word & ~bits
    ctypes.memmove(ctypes.addressof(env) + offset, word.to_bytes(_WORD, "little"), _WORD)
    if libm.fesetenv(env) != 0:
        return False
    if _flushes() != mode:  # not the register we thought: put everything back
        ctypes.memmove(env, saved, _ENV_BYTES)
        libm.fesetenv(env)
        return False
    return True


def flush_or_raise(what):
    """Flush subnormals in this thread (and those it starts) as ``what`` asked (a config key,
    a command-line flag): RuntimeError naming it where this platform cannot."""
    if not set_flush_denormal(True):
        raise RuntimeError(f"{what}: this platform's floating-point control register "
                           "cannot be set from Python here")


class flushing:
    """``with flushing(mode):`` flush subnormals in this thread while inside (``mode``
    False: leave the setting alone), and put back what was set before: the one-process
    baseline of a launch config that flushes (``world.flush_denormal``) computes as its
    stages do, without changing its caller's thread for good. RuntimeError where the
    setting cannot be made, naming the config key."""

    def __init__(self, mode, key="world.flush_denormal"):
        self.mode, self.key, self.before = bool(mode), key, None

    def __enter__(self):
        if self.mode:
            self.before = _flushes()
            flush_or_raise(self.key)
        return self

    def __exit__(self, *exc):
        if self.before is not None:
            set_flush_denormal(self.before)
        return False

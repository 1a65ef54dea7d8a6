"""dtype conversion: ``to``, ``type_as``, ``float()``, ... (differentiable casts)."""
import numpy as np

from ..autograd import dtype as _dt
from ..autograd.tensor import Tensor
from .registry import defop, record

__all__ = ["to"]

# The engine casts a gradient back to each input's dtype, so the rule is the identity.
ToCopyBackward0 = defop("ToCopyBackward0", vjps=(lambda xp, g, m: g,))


def to(input, *args, dtype=None, device=None, copy=False, non_blocking=False, memory_format=None):
    """``to(dtype)``, ``to(other)``, ``to("cpu")``: a differentiable cast."""
    for a in args:
        if isinstance(a, _dt.dtype) or (isinstance(a, type) and a in (float, int, complex, bool)):
            dtype = a
        elif isinstance(a, Tensor):
            dtype = a.dtype
        elif isinstance(a, str):
            if a.split(":")[0] != "cpu":
                raise RuntimeError(f"distgrad tensors live on the CPU; device {a!r} is not available")
        elif isinstance(a, np.dtype):
            dtype = _dt.from_numpy_dtype(a)
    if isinstance(device, str) and device.split(":")[0] != "cpu":
        raise RuntimeError(f"distgrad tensors live on the CPU; device {device!r} is not available")
    if dtype is None:
        return input.clone() if copy else input
    np_dtype = _dt.to_numpy_dtype(dtype)
    d = input._data
    if d.dtype == np_dtype and not copy:
        return input
    if d.dtype.kind == "c" and np_dtype.kind != "c":
        import warnings
        warnings.warn("Casting complex values to real discards the imaginary part", UserWarning,
                      stacklevel=2)
        d = d.real
    out = d.astype(np_dtype)
    if np_dtype.kind not in "fc":
        from ..autograd.tensor import _make
        return _make(out)
    return record(ToCopyBackward0, out, (input,))

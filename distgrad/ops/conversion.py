"""dtype conversion: ``to``, ``type_as``, ``float()``, ... (differentiable casts)."""
import numpy as np

from ..autograd import device as _device, dtype as _dt
from ..autograd.tensor import TensorBase
from ..autograd._internal import array_of, wrap, defop, record

__all__ = ["to"]

# The engine casts a gradient back to each input's dtype, so the rule is the identity.
ToCopyBackward0 = defop("ToCopyBackward0", vjps=(lambda xp, g, m: g,))


def _is_dtype(a):
    return isinstance(a, (_dt.dtype, np.dtype)) or (isinstance(a, type)
                                                      and a in (float, int, complex, bool))


def to(input, *args, dtype=None, device=None, copy=False, non_blocking=False, memory_format=None):
    """``to(dtype)``, ``to(device, dtype)``, ``to(other)``, keyword forms too: a
    differentiable cast. Devices other than the CPU raise ``RuntimeError``."""
    args = list(args)
    if args and isinstance(args[0], TensorBase):
        dtype = args.pop(0).dtype
    elif args and _is_dtype(args[0]):
        dtype = args.pop(0)
    elif args and isinstance(args[0], (str, _device.device, int)) and not isinstance(args[0], bool):
        device = args.pop(0)
        if args and _is_dtype(args[0]):
            dtype = args.pop(0)
    if len(args) > 2 or not all(isinstance(a, bool) for a in args):
        raise TypeError("to() received an invalid combination of arguments: expected (dtype), "
                        "(device, dtype) or (tensor), then non_blocking and copy as bools; got "
                        f"extra {tuple(type(a).__name__ for a in args)}")
    if len(args) == 2:
        copy = args[1]
    _device.as_cpu_device(device)
    if isinstance(dtype, np.dtype):
        dtype = _dt.from_numpy_dtype(dtype)
    if dtype is None:
        return input.clone() if copy else input
    np_dtype = _dt.to_numpy_dtype(dtype)
    d = array_of(input)
    if d.dtype == np_dtype and not copy:
        return input
    if d.dtype.kind == "c" and np_dtype.kind != "c":
        import warnings
        warnings.warn("Casting complex values to real discards the imaginary part", UserWarning,
                      stacklevel=2)
        d = d.real
    out = d.astype(np_dtype)
    if np_dtype.kind not in "fc":
        return wrap(out)
    return record(ToCopyBackward0, out, (input,))

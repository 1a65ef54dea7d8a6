"""In-place tensor methods that have no out-of-place op of their own: ``copy_``, ``fill_``,
``zero_``. The machinery every in-place op shares (version counters, checks, rebasing a
view's base) is ``autograd/inplace.py``'s :func:`apply_inplace`.
"""
import numpy as np

from ..autograd._internal import apply_inplace, array_of, defop, record
from ..autograd.tensor import TensorBase
from .promotion import as_tensor_operand

__all__ = ["copy_", "fill_", "zero_"]


CopyBackwards = defop("CopyBackwards", vjps=(lambda xp, g, m: g * 0, lambda xp, g, m: g))
FillBackward0 = defop("FillBackward0", vjps=(lambda xp, g, m: g * 0,))
FillBackward1 = defop("FillBackward1", vjps=(lambda xp, g, m: g * 0, lambda xp, g, m: xp.sum(g)))


def _copy_out(self, src):
    src = as_tensor_operand(src, self)
    d = array_of(self)
    try:
        out = np.broadcast_to(array_of(src), d.shape).astype(d.dtype, copy=True)
    except ValueError:
        raise RuntimeError(f"The size of tensor a ({list(d.shape)}) must match the size of tensor "
                           f"b ({list(array_of(src).shape)})") from None
    if array_of(src).dtype.kind == "c" and d.dtype.kind != "c":
        out = np.broadcast_to(array_of(src).real, d.shape).astype(d.dtype, copy=True)
    return record(CopyBackwards, out, (self, src))


def copy_(self, src, non_blocking=False):
    return apply_inplace(self, _copy_out, src)


def _fill_out(self, value):
    d = array_of(self)
    if isinstance(value, TensorBase):
        if array_of(value).ndim != 0:
            raise RuntimeError(f"fill_ only supports 0-dimension value tensor but got tensor with "
                               f"{array_of(value).ndim} dimensions.")
        return record(FillBackward1, np.full(d.shape, array_of(value), dtype=d.dtype), (self, value))
    return record(FillBackward0, np.full(d.shape, value, dtype=d.dtype), (self,))


def fill_(self, value):
    return apply_inplace(self, _fill_out, value)


def zero_(self):
    return apply_inplace(self, _fill_out, 0)

"""PyTorch's type promotion for binary ops, on top of NumPy's.

NumPy and PyTorch agree when both operands have the same dtype (the hot path,
which costs one comparison here). They differ for integer tensors mixed with
floats (PyTorch gives the float operand's type, or the default dtype for a
Python float) and for 0-dim tensors, which in PyTorch do not raise the category
of a dimensioned operand's dtype.
"""
import numbers

import numpy as np

from ..autograd import dtype as _dt
from ..autograd.tensor import TensorBase
from ..autograd._internal import array_of, wrap

__all__ = ["operands", "result_dtype", "as_tensor_operand"]

_CATEGORY = {"b": 0, "u": 1, "i": 1, "f": 2, "c": 3}


def _scalar_category(value):
    if isinstance(value, bool):
        return 0
    if isinstance(value, numbers.Integral):
        return 1
    if isinstance(value, numbers.Real):
        return 2
    if isinstance(value, numbers.Complex):
        return 3
    raise TypeError(f"unsupported operand type {type(value).__name__}; expected a Tensor or a number")


def _default_for(category, like=None):
    if category == 2:
        return _dt.get_default_dtype().numpy
    if category == 3:
        if like is not None and like.kind == "f" and like.itemsize == 8:
            return np.dtype(np.complex128)
        return _dt.get_default_dtype().to_complex().numpy
    if category == 1:
        return np.dtype(np.int64)
    return np.dtype(np.bool_)


def result_dtype(a, b):
    """The dtype PyTorch gives ``a op b`` for ndarrays ``a``, ``b`` of different dtypes."""
    ca, cb = _CATEGORY[a.dtype.kind], _CATEGORY[b.dtype.kind]
    a_dim, b_dim = a.ndim > 0, b.ndim > 0
    if a_dim != b_dim:
        dim_arr, zero_arr = (a, b) if a_dim else (b, a)
        cd, cz = _CATEGORY[dim_arr.dtype.kind], _CATEGORY[zero_arr.dtype.kind]
        if cz <= cd:
            return dim_arr.dtype
        if cz == 3 and cd == 2:
            return np.promote_types(zero_arr.dtype, np.result_type(dim_arr.dtype, np.complex64))
        return zero_arr.dtype
    if ca == cb:
        return np.promote_types(a.dtype, b.dtype)
    hi, lo = (a, b) if ca > cb else (b, a)
    if _CATEGORY[hi.dtype.kind] == 3 and _CATEGORY[lo.dtype.kind] == 2:
        return np.promote_types(hi.dtype, lo.dtype)
    return hi.dtype


def scalar_result_dtype(arr, value):
    """The dtype of ``tensor op python_number``."""
    cs = _scalar_category(value)
    ct = _CATEGORY[arr.dtype.kind]
    if cs <= ct:
        return arr.dtype
    if cs == 3 and ct == 2:
        return np.result_type(arr.dtype, np.complex64)
    return _default_for(cs, arr.dtype)


def operands(a, b):
    """Normalise ``a op b``: returns (tensor_a, tensor_b, array_a, array_b, out_dtype).

    A Python number stays a number (tensor slot None) so NumPy treats it as a weak
    scalar; arrays are cast when PyTorch's result type differs from NumPy's.
    """
    if isinstance(a, TensorBase):
        ad = array_of(a)
        if isinstance(b, TensorBase):
            bd = array_of(b)
            if ad.dtype is bd.dtype or ad.dtype == bd.dtype:
                return a, b, ad, bd, ad.dtype
            dt = result_dtype(ad, bd)
            return a, b, ad.astype(dt, copy=False), bd.astype(dt, copy=False), dt
        if isinstance(b, np.ndarray):
            return operands(a, wrap(b))
        dt = scalar_result_dtype(ad, b)
        return a, None, ad.astype(dt, copy=False), b, dt
    if isinstance(b, TensorBase):
        if isinstance(a, np.ndarray):
            return operands(wrap(a), b)
        bd = array_of(b)
        dt = scalar_result_dtype(bd, a)
        return None, b, a, bd.astype(dt, copy=False), dt
    raise TypeError(f"expected at least one Tensor operand, got {type(a).__name__} and "
                    f"{type(b).__name__}")


def as_tensor_operand(value, like=None):
    """A Tensor for ``value``: tensors pass through, numbers become 0-dim tensors."""
    if isinstance(value, TensorBase):
        return value
    if isinstance(value, np.ndarray):
        return wrap(value)
    dt = scalar_result_dtype(array_of(like), value) if like is not None else None
    return wrap(np.asarray(value, dtype=dt))

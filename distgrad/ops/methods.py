"""Install the ops as Tensor methods and operators, under PyTorch's names."""
import numpy as np

from ..autograd.tensor import Tensor
from . import (arithmetic, complex as complex_ops, conversion, creation, indexing, inplace, linalg,
               reduction, shape, softmax, unary)
from .promotion import as_tensor_operand

_METHODS = {
    arithmetic: ["add", "sub", "subtract", "mul", "multiply", "div", "divide", "true_divide",
                 "floor_divide", "remainder", "fmod", "pow", "neg", "negative", "reciprocal",
                 "square", "eq", "ne", "lt", "le", "gt", "ge", "logical_not", "logical_and",
                 "logical_or", "equal", "allclose", "isclose", "isnan", "isinf", "isfinite"],
    unary: ["exp", "log", "log2", "log10", "log1p", "expm1", "sqrt", "rsqrt", "abs", "absolute",
            "sin", "cos", "tan", "tanh", "sigmoid", "relu", "erf", "clamp", "clip", "clamp_min",
            "clamp_max", "sign", "sgn", "floor", "ceil", "round", "trunc"],
    reduction: ["sum", "mean", "var", "std", "max", "min", "amax", "amin", "prod", "logsumexp",
                "argmax", "argmin", "all", "any", "norm", "cumsum", "count_nonzero"],
    linalg: ["matmul", "mm", "bmm", "dot", "mv", "outer"],
    shape: ["reshape", "view", "view_as", "transpose", "swapaxes", "swapdims", "permute", "t",
            "squeeze", "unsqueeze", "expand", "expand_as", "broadcast_to", "flatten", "unflatten",
            "split", "chunk", "unbind", "clone", "contiguous", "flip", "movedim", "narrow",
            "repeat", "tile", "reshape_as", "sum_to_size"],
    indexing: ["index_select", "gather", "masked_fill", "masked_select", "maximum", "minimum",
               "take_along_dim", "scatter_add", "fmax", "fmin", "sort", "argsort", "topk"],
    complex_ops: ["conj", "conj_physical", "angle"],
    softmax: ["softmax", "log_softmax"],
    conversion: ["to"],
}

# name_ -> the out-of-place op it writes back
_INPLACE = {
    "add_": arithmetic.add, "sub_": arithmetic.sub, "mul_": arithmetic.mul, "div_": arithmetic.div,
    "pow_": arithmetic.pow, "neg_": arithmetic.neg, "reciprocal_": arithmetic.reciprocal,
    "floor_divide_": arithmetic.floor_divide, "remainder_": arithmetic.remainder,
    "exp_": unary.exp, "log_": unary.log, "sqrt_": unary.sqrt, "rsqrt_": unary.rsqrt,
    "abs_": unary.abs, "sin_": unary.sin, "cos_": unary.cos, "tanh_": unary.tanh,
    "sigmoid_": unary.sigmoid, "relu_": unary.relu, "clamp_": unary.clamp, "clip_": unary.clamp,
    "clamp_min_": unary.clamp_min, "clamp_max_": unary.clamp_max, "floor_": unary.floor,
    "ceil_": unary.ceil, "round_": unary.round, "trunc_": unary.trunc, "sign_": unary.sign,
    "log1p_": unary.log1p, "expm1_": unary.expm1, "square_": arithmetic.square,
    "masked_fill_": indexing.masked_fill, "erf_": unary.erf, "scatter_add_": indexing.scatter_add,
}


def _inplace_method(name, fn):
    def method(self, *args, **kwargs):
        return inplace.apply_inplace(self, fn, *args, **kwargs)
    method.__name__ = name
    method.__doc__ = f"In-place version of :meth:`{name[:-1]}`."
    return method


def _reflected(fn):
    def method(self, other):
        return fn(as_tensor_operand(other, self) if isinstance(other, np.ndarray) else other, self)
    return method


def _setitem(self, key, value):
    inplace.apply_inplace(self, indexing.index_put, key, value)


def _invert(self):
    d = self._data
    if d.dtype == np.bool_:
        return arithmetic.logical_not(self)
    from ..autograd.tensor import _make
    return _make(np.invert(d))


def _bitwise(ufunc):
    def method(self, other):
        from ..autograd.tensor import _make
        o = other._data if isinstance(other, Tensor) else other
        return _make(ufunc(self._data, o))
    return method


def _type_method(dtype_name):
    def method(self, memory_format=None):
        from ..autograd import dtype as _dt
        return conversion.to(self, getattr(_dt, dtype_name))
    method.__name__ = dtype_name
    return method


def _type(self, dtype=None, non_blocking=False):
    """``x.type()`` names the tensor type; ``x.type(dtype)`` converts, as in PyTorch."""
    if dtype is None:
        from ..autograd.tensor import _describe
        return _describe(self._data).split(" ")[0]
    return conversion.to(self, dtype)


def _new_factory(factory):
    def method(self, *size, dtype=None, device=None, requires_grad=False, **kwargs):
        return factory(*size, dtype=dtype or self.dtype, requires_grad=requires_grad, **kwargs)
    return method


def _uniform_(self, a=0.0, b=1.0, *, generator=None):
    from ..autograd.tensor import _make
    rng = creation._rng(generator)
    return inplace.apply_inplace(self, lambda t: _make(rng.uniform(a, b, t._data.shape)
                                                       .astype(t._data.dtype)))


def _normal_(self, mean=0.0, std=1.0, *, generator=None):
    from ..autograd.tensor import _make
    rng = creation._rng(generator)
    return inplace.apply_inplace(self, lambda t: _make(rng.normal(mean, std, t._data.shape)
                                                       .astype(t._data.dtype)))


def install():
    for module, names in _METHODS.items():
        for name in names:
            setattr(Tensor, name, getattr(module, name))
    for name, fn in _INPLACE.items():
        setattr(Tensor, name, _inplace_method(name, fn))
    T = Tensor
    T.copy_ = inplace.copy_
    T.fill_ = inplace.fill_
    T.zero_ = inplace.zero_
    T.uniform_ = _uniform_
    T.normal_ = _normal_
    T.__getitem__ = indexing.getitem
    T.__setitem__ = _setitem
    T.__add__ = arithmetic.add
    T.__radd__ = _reflected(arithmetic.add)
    T.__iadd__ = T.add_
    T.__sub__ = arithmetic.sub
    T.__rsub__ = _reflected(arithmetic.sub)
    T.__isub__ = T.sub_
    T.__mul__ = arithmetic.mul
    T.__rmul__ = _reflected(arithmetic.mul)
    T.__imul__ = T.mul_
    T.__truediv__ = arithmetic.div
    T.__rtruediv__ = _reflected(arithmetic.div)
    T.__itruediv__ = T.div_
    T.__floordiv__ = arithmetic.floor_divide
    T.__rfloordiv__ = _reflected(arithmetic.floor_divide)
    T.__mod__ = arithmetic.remainder
    T.__rmod__ = _reflected(arithmetic.remainder)
    T.__pow__ = arithmetic.pow
    T.__rpow__ = _reflected(arithmetic.pow)
    T.__ipow__ = T.pow_
    T.__matmul__ = linalg.matmul
    T.__rmatmul__ = _reflected(linalg.matmul)
    T.__neg__ = arithmetic.neg
    T.__pos__ = lambda self: self
    T.__abs__ = unary.abs
    T.__eq__ = arithmetic.eq
    T.__ne__ = arithmetic.ne
    T.__lt__ = arithmetic.lt
    T.__le__ = arithmetic.le
    T.__gt__ = arithmetic.gt
    T.__ge__ = arithmetic.ge
    T.__invert__ = _invert
    T.__and__ = _bitwise(np.bitwise_and)
    T.__or__ = _bitwise(np.bitwise_or)
    T.__xor__ = _bitwise(np.bitwise_xor)
    T.__rand__ = T.__and__
    T.__ror__ = T.__or__
    T.__rxor__ = T.__xor__
    T.T = property(lambda self: shape.permute(self, *reversed(range(self._data.ndim))))
    T.mT = property(lambda self: shape.transpose(self, -2, -1))
    T.H = property(lambda self: complex_ops.conj(shape.t(self)))
    T.mH = property(lambda self: complex_ops.conj(shape.transpose(self, -2, -1)))
    T.real = property(complex_ops.real)
    T.imag = property(complex_ops.imag)
    T.where = lambda self, condition, other: indexing.where(condition, self, other)
    T.softmax = lambda self, dim, dtype=None: softmax.softmax(self, dim, dtype)
    T.log_softmax = lambda self, dim, dtype=None: softmax.log_softmax(self, dim, dtype)
    T.float = _type_method("float32")
    T.double = _type_method("float64")
    T.half = _type_method("float16")
    T.long = _type_method("int64")
    T.int = _type_method("int32")
    T.bool = _type_method("bool")
    T.cfloat = _type_method("complex64")
    T.cdouble = _type_method("complex128")
    T.type_as = lambda self, other: conversion.to(self, other.dtype)
    T.type = _type
    T.cpu = lambda self, memory_format=None: self
    T.new_zeros = _new_factory(creation.zeros)
    T.new_ones = _new_factory(creation.ones)
    T.new_empty = _new_factory(creation.empty)
    T.new_full = lambda self, size, fill_value, dtype=None, requires_grad=False: creation.full(
        size, fill_value, dtype=dtype or self.dtype, requires_grad=requires_grad)
    T.new_tensor = lambda self, data, dtype=None, requires_grad=False: creation.tensor(
        data, dtype=dtype or self.dtype, requires_grad=requires_grad)
    T.gelu = unary.gelu

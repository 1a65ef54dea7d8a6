"""The ops as Tensor methods and operators, under PyTorch's names: one table, read by
``distgrad.Tensor`` (``distgrad/_tensor.py``) through :class:`TensorMethods`.

>>> import distgrad
>>> TensorMethods.exp is distgrad.exp and distgrad.Tensor.exp is distgrad.exp
True
"""
import numpy as np

from ..autograd import dtype as _dt

from ..autograd.tensor import TensorBase
from . import (arithmetic, complex as complex_ops, conversion, creation, diag, indexing, inplace,
               legacy, linalg, memory, random, reduction, scatter, shape, softmax, unary)
from .promotion import as_tensor_operand
from ..autograd._internal import apply_inplace, array_of, wrap, describe, observed

_METHODS = {
    arithmetic: ["add", "sub", "subtract", "mul", "multiply", "div", "divide", "true_divide",
                 "floor_divide", "remainder", "fmod", "pow", "neg", "negative", "reciprocal",
                 "square", "eq", "ne", "lt", "le", "gt", "ge", "logical_not", "logical_and",
                 "logical_or", "equal", "allclose", "isclose", "isnan", "isinf", "isfinite"],
    unary: ["exp", "log", "log2", "log10", "log1p", "expm1", "sqrt", "rsqrt", "abs", "absolute",
            "sin", "cos", "tan", "tanh", "sigmoid", "relu", "erf", "clamp", "clip", "clamp_min",
            "clamp_max", "sign", "sgn", "floor", "ceil", "round", "trunc"],
    reduction: ["sum", "mean", "var", "std", "max", "min", "amax", "amin", "prod", "logsumexp",
                "argmax", "argmin", "all", "any", "norm", "cumsum", "count_nonzero",
                "sum_to_size"],
    linalg: ["matmul", "mm", "bmm", "dot", "mv", "outer"],
    shape: ["reshape", "view", "view_as", "transpose", "swapaxes", "swapdims", "permute", "t",
            "squeeze", "unsqueeze", "expand", "expand_as", "broadcast_to", "flatten", "unflatten",
            "split", "chunk", "unbind", "clone", "contiguous", "flip", "movedim", "narrow",
            "repeat", "tile", "reshape_as"],
    indexing: ["index_select", "gather", "masked_fill", "masked_select", "maximum", "minimum",
               "take_along_dim", "fmax", "fmin", "sort", "argsort", "topk", "tril", "triu"],
    scatter: ["scatter", "scatter_add", "index_add", "index_fill", "index_copy"],
    complex_ops: ["conj", "conj_physical", "angle"],
    softmax: ["softmax", "log_softmax"],
    conversion: ["to"],
    random: ["random_", "uniform_", "normal_", "exponential_", "bernoulli_", "bernoulli",
             "multinomial"],
    inplace: ["copy_", "fill_", "zero_"],
    memory: ["data_ptr", "storage_offset"],
    diag: ["diag", "diag_embed", "diagflat"],
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
    "masked_fill_": indexing.masked_fill, "erf_": unary.erf,
    "tril_": indexing.tril, "triu_": indexing.triu,
    "scatter_": scatter.scatter, "scatter_add_": scatter.scatter_add,
    "index_add_": scatter.index_add, "index_fill_": scatter.index_fill,
    "index_copy_": scatter.index_copy,
}


# x op y, y op x (reflected) and x op= y (the in-place method, where PyTorch has one); the
# op is looked up when installed (after the profiler's wrapping, see op_names.py)
_BINARY_OPERATORS = {
    "add": (arithmetic, "add", "add_"), "sub": (arithmetic, "sub", "sub_"),
    "mul": (arithmetic, "mul", "mul_"), "truediv": (arithmetic, "div", "div_"),
    "floordiv": (arithmetic, "floor_divide", None), "mod": (arithmetic, "remainder", None),
    "pow": (arithmetic, "pow", "pow_"), "matmul": (linalg, "matmul", None),
}

_TYPE_METHODS = {"float": "float32", "double": "float64", "half": "float16", "long": "int64",
                 "int": "int32", "bool": "bool", "cfloat": "complex64", "cdouble": "complex128"}


def _inplace_method(name, fn):
    def method(self, *args, **kwargs):
        return apply_inplace(self, fn, *args, **kwargs)
    method.__name__ = name
    method.__doc__ = f"In-place version of :meth:`{name[:-1]}`."
    return observed(f"aten::{name}", method)


def _reflected(fn):
    def method(self, other):
        return fn(as_tensor_operand(other, self) if isinstance(other, np.ndarray) else other, self)
    return method


def _setitem(self, key, value):
    apply_inplace(self, indexing.index_put, key, value)


def _invert(self):
    d = array_of(self)
    if d.dtype == np.bool_:
        return arithmetic.logical_not(self)
    return wrap(np.invert(d))


def _bitwise(ufunc):
    def method(self, other):
        o = array_of(other) if isinstance(other, TensorBase) else other
        return wrap(ufunc(array_of(self), o))
    return method


def _type_method(dtype_name):
    def method(self, memory_format=None):
        return conversion.to(self, getattr(_dt, dtype_name))
    method.__name__ = dtype_name
    return method


def _type(self, dtype=None, non_blocking=False):
    """``x.type()`` names the tensor type; ``x.type(dtype)`` converts (also given a legacy
    type, ``x.type(distgrad.LongTensor)`` or ``x.type("torch.LongTensor")``), as in PyTorch."""
    if dtype is None:
        return describe(array_of(self)).split(" ")[0]
    return conversion.to(self, legacy.as_dtype(dtype) or dtype)


def _new_factory(factory):
    def method(self, *size, dtype=None, device=None, requires_grad=False, **kwargs):
        return factory(*size, dtype=dtype or self.dtype, requires_grad=requires_grad, **kwargs)
    return method


def _table():
    """{name: function or property} of every method and operator the ops give a Tensor."""
    ns = {name: getattr(module, name) for module, names in _METHODS.items() for name in names}
    ns.update((name, _inplace_method(name, fn)) for name, fn in _INPLACE.items())
    ns.update(new=legacy.new, __getitem__=indexing.getitem, __setitem__=_setitem)
    for op, (module, name, inplace_name) in _BINARY_OPERATORS.items():
        fn = ns[f"__{op}__"] = getattr(module, name)
        ns[f"__r{op}__"] = _reflected(fn)
        if inplace_name is not None:
            ns[f"__i{op}__"] = ns[inplace_name]
    ns.update(__neg__=arithmetic.neg, __pos__=lambda self: self, __abs__=unary.abs,
              __eq__=arithmetic.eq, __ne__=arithmetic.ne, __lt__=arithmetic.lt,
              __le__=arithmetic.le, __gt__=arithmetic.gt, __ge__=arithmetic.ge,
              __invert__=_invert, __and__=_bitwise(np.bitwise_and),
              __or__=_bitwise(np.bitwise_or), __xor__=_bitwise(np.bitwise_xor))
    ns.update(__rand__=ns["__and__"], __ror__=ns["__or__"], __rxor__=ns["__xor__"])
    ns.update(
        T=property(lambda self: shape.permute(self, *reversed(range(array_of(self).ndim)))),
        mT=property(lambda self: shape.transpose(self, -2, -1)),
        H=property(lambda self: complex_ops.conj(shape.t(self))),
        mH=property(lambda self: complex_ops.conj(shape.transpose(self, -2, -1))),
        real=property(complex_ops.real), imag=property(complex_ops.imag),
        where=lambda self, condition, other: indexing.where(condition, self, other))
    ns.update((method, _type_method(dtype_name)) for method, dtype_name in _TYPE_METHODS.items())
    ns.update(
        type_as=lambda self, other: conversion.to(self, other.dtype), type=_type,
        cpu=lambda self, memory_format=None: self,
        new_zeros=_new_factory(creation.zeros), new_ones=_new_factory(creation.ones),
        new_empty=_new_factory(creation.empty),
        new_full=lambda self, size, fill_value, *, dtype=None, device=None, requires_grad=False:
            creation.full(size, fill_value, dtype=dtype or self.dtype, requires_grad=requires_grad),
        new_tensor=lambda self, data, *, dtype=None, device=None, requires_grad=False:
            creation.tensor(data, dtype=dtype or self.dtype, requires_grad=requires_grad),
        gelu=unary.gelu)
    return ns


TensorMethods = type("TensorMethods", (), {
    "__doc__": "A Tensor's math methods, operators and conversions (a base of distgrad.Tensor).",
    "__module__": __name__, "__slots__": (), **_table()})

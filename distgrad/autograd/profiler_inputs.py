"""What the profiler says about an op's inputs: shapes, types, concrete values, FLOPs.

As PyTorch's ``record_shapes`` (``Input Dims``, ``Input type``, ``Concrete Inputs`` in the
trace): a tensor is its shape and its C++ element type (``float``, ``long int``), a Python
number is ``Scalar`` with its value, a list of numbers a ``ScalarList``, a list of tensors a
``TensorList`` (shape ``[]``), anything else an empty entry. ``with_flops`` uses PyTorch's
formulas for the ops it counts (matrix products, convolutions, element-wise add and mul).
"""
import math

import numpy as np

from .tensor import TensorBase as Tensor  # every distgrad.Tensor is one

__all__ = ["describe", "grad_shapes", "flops"]

# NumPy dtype -> PyTorch's C++ scalar type name, as its traces print it
_TYPE_NAMES = {"float32": "float", "float64": "double", "float16": "c10::Half",
               "int64": "long int", "int32": "int", "int16": "short int", "int8": "signed char",
               "uint8": "unsigned char", "bool": "bool", "complex64": "c10::complex<float>",
               "complex128": "c10::complex<double>"}


def _one(value):
    """(shape, type, concrete value) of one argument."""
    if isinstance(value, Tensor):
        d = value._data
        return list(d.shape), _TYPE_NAMES.get(d.dtype.name, d.dtype.name), ""
    if isinstance(value, np.ndarray):
        return list(value.shape), _TYPE_NAMES.get(value.dtype.name, value.dtype.name), ""
    if isinstance(value, (bool, int, float, complex, np.generic)):
        return [], "Scalar", str(value)
    if isinstance(value, (list, tuple)):
        if value and all(isinstance(v, Tensor) for v in value):
            return [], "TensorList", ""
        if all(isinstance(v, (bool, int, float)) for v in value):
            return [], "ScalarList", str(list(value))
    return [], "", ""


def describe(args, kwargs):
    """``{"shapes", "types", "concrete"}`` of an op's arguments (positional, then keyword)."""
    shapes, types, concrete = [], [], []
    for value in (*args, *kwargs.values()) if kwargs else args:
        s, t, c = _one(value)
        shapes.append(s)
        types.append(t)
        concrete.append(c)
    return {"shapes": shapes, "types": types, "concrete": concrete}


def grad_shapes(grads):
    """Input shapes of a backward node: its incoming gradients' (``[]`` for None)."""
    return [list(np.shape(g)) if g is not None else [] for g in grads]


def _shape(value):
    if isinstance(value, Tensor):
        return value._data.shape
    return np.shape(value)


def _matmul(a, b):
    a, b = _shape(a), _shape(b)
    if len(a) < 1 or len(b) < 1:
        return 0
    k = a[-1]
    m = a[-2] if len(a) > 1 else 1
    n = b[-1] if len(b) > 1 else 1
    batch = np.broadcast_shapes(a[:-2], b[:-2]) if len(a) > 2 or len(b) > 2 else ()
    return 2 * math.prod(batch) * m * k * n


def _conv(args, kwargs, dims):
    x, w = _shape(args[0]), _shape(args[1])
    if len(x) < dims + 2 or len(w) < dims + 2:
        return 0
    names = ("stride", "padding", "dilation")
    params = [kwargs.get(n, args[3 + i] if len(args) > 3 + i else (1 if n != "padding" else 0))
              for i, n in enumerate(names)]
    stride, padding, dilation = (p if isinstance(p, (tuple, list)) else (p,) * dims
                                 for p in params)
    if isinstance(padding, str):
        return 0
    out = [(x[2 + i] + 2 * padding[i] - dilation[i] * (w[2 + i] - 1) - 1) // stride[i] + 1
           for i in range(dims)]
    return 2 * x[0] * math.prod(out) * w[0] * w[1] * math.prod(w[2:])


def _elementwise(args, kwargs):
    shapes = [_shape(a) for a in args[:2] if isinstance(a, (Tensor, np.ndarray))]
    return math.prod(np.broadcast_shapes(*shapes)) if shapes else 0


_FLOPS = {
    "aten::mm": lambda a, k: _matmul(a[0], a[1]),
    "aten::bmm": lambda a, k: _matmul(a[0], a[1]),
    "aten::matmul": lambda a, k: _matmul(a[0], a[1]),
    "aten::addmm": lambda a, k: _matmul(a[1], a[2]),
    "aten::linear": lambda a, k: 2 * math.prod(_shape(a[0])) * _shape(a[1])[0],
    "aten::conv1d": lambda a, k: _conv(a, k, 1),
    "aten::conv2d": lambda a, k: _conv(a, k, 2),
    "aten::add": _elementwise,
    "aten::mul": _elementwise,
}


def flops(name, args, kwargs):
    """PyTorch's FLOP estimate of op ``name`` on these arguments (0 for ops it does not count)."""
    rule = _FLOPS.get(name)
    if rule is None:
        return 0
    try:
        return int(rule(args, kwargs))
    except (IndexError, TypeError, ValueError):  # arguments the op itself will refuse
        return 0

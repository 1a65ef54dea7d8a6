"""PyTorch-style dtype objects over NumPy dtypes, and the default dtype."""
import numpy as np
from .naming import public_name

__all__ = ["dtype", "float16", "float32", "float64", "complex64", "complex128",
           "int8", "int16", "int32", "int64", "uint8", "bool",
           "get_default_dtype", "set_default_dtype", "to_numpy_dtype", "from_numpy_dtype"]


class dtype:
    """A tensor element type; compares by identity, prints as ``distgrad.float32``."""

    __slots__ = ("name", "numpy", "is_floating_point", "is_complex", "is_signed", "itemsize")

    def __init__(self, name, np_dtype):
        self.name = name
        self.numpy = np.dtype(np_dtype)
        kind = self.numpy.kind
        self.is_floating_point = kind == "f"
        self.is_complex = kind == "c"
        self.is_signed = kind in "fic"
        self.itemsize = self.numpy.itemsize

    def __repr__(self):
        return f"{public_name()}.{self.name}"

    def __reduce__(self):  # dtypes are singletons, even through copy/deepcopy
        return (from_numpy_dtype, (self.numpy,))

    def to_real(self):
        return {complex64: float32, complex128: float64}.get(self, self)

    def to_complex(self):
        return {float32: complex64, float64: complex128, float16: complex64}.get(self, self)


float16 = dtype("float16", np.float16)
float32 = dtype("float32", np.float32)
float64 = dtype("float64", np.float64)
complex64 = dtype("complex64", np.complex64)
complex128 = dtype("complex128", np.complex128)
int8 = dtype("int8", np.int8)
int16 = dtype("int16", np.int16)
int32 = dtype("int32", np.int32)
int64 = dtype("int64", np.int64)
uint8 = dtype("uint8", np.uint8)
bool = dtype("bool", np.bool_)  # noqa: A001 - PyTorch's name

_BY_NUMPY = {d.numpy: d for d in (float16, float32, float64, complex64, complex128,
                                  int8, int16, int32, int64, uint8, bool)}


def from_numpy_dtype(np_dtype):
    try:
        return _BY_NUMPY[np_dtype]
    except KeyError:
        np_dtype = np.dtype(np_dtype)
        if np_dtype in _BY_NUMPY:
            return _BY_NUMPY[np_dtype]
        raise TypeError(f"can't convert np.ndarray of type {np_dtype}; the supported types are: "
                        "float64, float32, float16, complex64, complex128, int64, int32, int16, "
                        "int8, uint8, and bool") from None


def to_numpy_dtype(d):
    """Accept a distgrad dtype, a NumPy dtype or a Python type; return a NumPy dtype."""
    if isinstance(d, dtype):
        return d.numpy
    if d is float:
        return _default[0].numpy
    if d is complex:
        return _default[0].to_complex().numpy
    if d is int:
        return int64.numpy
    return from_numpy_dtype(np.dtype(d)).numpy


# A one-element list so readers on the hot path avoid a function call.
_default = [float32]


def get_default_dtype():
    """The dtype of tensors made from Python floats (``float32`` unless changed)."""
    return _default[0]


def set_default_dtype(d):
    """Set the default floating dtype; only ``float32`` and ``float64`` are allowed, as in PyTorch."""
    if d not in (float32, float64, float16):
        raise TypeError(f"only floating-point types are supported as the default type, got {d!r}")
    _default[0] = d


_SCALAR_TYPE_NAMES = {"float16": "Half", "float32": "Float", "float64": "Double",
                      "complex64": "ComplexFloat", "complex128": "ComplexDouble",
                      "int64": "Long", "int32": "Int", "int16": "Short", "int8": "Char",
                      "uint8": "Byte", "bool": "Bool"}


def scalar_type_name(np_dtype):
    """PyTorch's name of a dtype in messages: ``Float``, ``Double``, ``Long``..."""
    return _SCALAR_TYPE_NAMES.get(np_dtype.name, np_dtype.name)

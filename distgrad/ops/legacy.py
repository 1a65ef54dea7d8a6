"""PyTorch's legacy tensor types: ``FloatTensor``, ``LongTensor``, ... and ``Tensor.new``.

``distgrad.FloatTensor(2, 3)`` is an uninitialised float32 tensor of that shape,
``distgrad.FloatTensor([1, 2])`` holds that data, and ``isinstance(x,
distgrad.FloatTensor)`` asks whether ``x`` is a float32 tensor, as in PyTorch (where
these types are not subclasses of ``Tensor`` either: they construct and test).

>>> import distgrad
>>> x = distgrad.LongTensor([1, 2])
>>> x.dtype, isinstance(x, distgrad.LongTensor), isinstance(x, distgrad.FloatTensor)
(distgrad.int64, True, False)
"""
from ..autograd import dtype as _dt
from ..autograd.tensor import TensorBase
from ..autograd._internal import array_of, version_counter, wrap, legacy_array

__all__ = ["FloatTensor", "DoubleTensor", "HalfTensor", "LongTensor", "IntTensor",
           "ShortTensor", "CharTensor", "ByteTensor", "BoolTensor"]


class _TensorType(type):
    """The metaclass of the legacy types: calling one constructs, ``isinstance`` checks the dtype."""

    def __call__(cls, *args, device=None):
        return _construct(args, cls.dtype.numpy)

    def __instancecheck__(cls, obj):
        return isinstance(obj, TensorBase) and array_of(obj).dtype == cls.dtype.numpy

    def __repr__(cls):
        return f"<class 'distgrad.{cls.__name__}'>"


def _construct(args, np_dtype):
    if len(args) == 1 and isinstance(args[0], TensorBase):
        src = args[0]
        if array_of(src).dtype != np_dtype:
            raise TypeError(f"expected {_type_name(np_dtype)} (got {_type_name(array_of(src).dtype)})")
        return wrap(array_of(src), vc=version_counter(src))
    return wrap(legacy_array(args, np_dtype))


def _type_name(np_dtype):
    return next((name for name, dtype in _TYPES.items() if dtype.numpy == np_dtype),
                np_dtype.name)


_TYPES = {"FloatTensor": _dt.float32, "DoubleTensor": _dt.float64, "HalfTensor": _dt.float16,
          "LongTensor": _dt.int64, "IntTensor": _dt.int32, "ShortTensor": _dt.int16,
          "CharTensor": _dt.int8, "ByteTensor": _dt.uint8, "BoolTensor": _dt.bool}

_LEGACY = {name: _TensorType(name, (), {"dtype": dtype, "__module__": "distgrad"})
           for name, dtype in _TYPES.items()}
FloatTensor = _LEGACY["FloatTensor"]
DoubleTensor = _LEGACY["DoubleTensor"]
HalfTensor = _LEGACY["HalfTensor"]
LongTensor = _LEGACY["LongTensor"]
IntTensor = _LEGACY["IntTensor"]
ShortTensor = _LEGACY["ShortTensor"]
CharTensor = _LEGACY["CharTensor"]
ByteTensor = _LEGACY["ByteTensor"]
BoolTensor = _LEGACY["BoolTensor"]


def as_dtype(type_):
    """The dtype a legacy type stands for: the class itself, or its name as a string
    (``"torch.LongTensor"``, ``"distgrad.LongTensor"``, ``"LongTensor"``); None otherwise."""
    if isinstance(type_, _TensorType):
        return type_.dtype
    if isinstance(type_, str):
        cls = _LEGACY.get(type_.rsplit(".", 1)[-1])
        if cls is None:
            raise ValueError(f"invalid type: '{type_}'")
        return cls.dtype
    return None


def new(self, *args, device=None):
    """``x.new(...)``: a legacy constructor call with ``x``'s dtype (``x.new(3).zero_()``)."""
    return _construct(args, array_of(self).dtype)

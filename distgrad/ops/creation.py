"""Tensor factories with PyTorch's signatures and dtype inference, and the global RNG."""
import numbers

import numpy as np

from ..autograd import device as _device, dtype as _dt
from ..autograd.tensor import TensorBase
from ..autograd._internal import array_of, wrap, as_array

__all__ = ["tensor", "as_tensor", "from_numpy", "zeros", "ones", "empty", "full", "arange",
           "linspace", "eye", "rand", "randn", "randint", "randperm", "normal", "zeros_like",
           "ones_like", "empty_like", "full_like", "rand_like", "randn_like", "randint_like",
           "manual_seed", "seed", "initial_seed", "Generator", "default_generator",
           "get_rng_state", "set_rng_state"]


class Generator:
    """A random number generator (PCG64 underneath), seeded like ``torch.Generator``."""

    def __init__(self, device="cpu"):
        self.device = _device.as_cpu_device(device)
        self._seed = 67280421310721
        self._rng = np.random.default_rng(self._seed)

    def manual_seed(self, seed):
        self._seed = int(seed)
        self._rng = np.random.default_rng(self._seed)
        return self

    def seed(self):
        s = int(np.random.SeedSequence().entropy % (1 << 63))
        self.manual_seed(s)
        return s

    def initial_seed(self):
        return self._seed

    def get_state(self):
        return self._rng.bit_generator.state

    def set_state(self, state):
        self._rng.bit_generator.state = state


default_generator = Generator()


def manual_seed(seed):
    """Seed the global generator (``distgrad.manual_seed(0)`` makes runs repeatable)."""
    return default_generator.manual_seed(seed)


def seed():
    return default_generator.seed()


def initial_seed():
    return default_generator.initial_seed()


def get_rng_state():
    return default_generator.get_state()


def set_rng_state(state):
    default_generator.set_state(state)


def _rng(generator):
    return (generator or default_generator)._rng


def _size(size):
    if len(size) == 1 and isinstance(size[0], (tuple, list)):
        size = tuple(size[0])
    out = tuple(int(s) for s in size)
    for s in out:
        if s < 0:
            raise RuntimeError(f"Trying to create tensor with negative dimension {s}: {list(out)}")
    return out


def _float_dtype(dtype):
    d = _dt.to_numpy_dtype(dtype) if dtype is not None else _dt.get_default_dtype().numpy
    return d


def _finish(arr, requires_grad, device=None):
    _device.as_cpu_device(device)
    t = wrap(arr)
    if requires_grad:
        t.requires_grad_(True)
    return t


def tensor(data, *, dtype=None, device=None, requires_grad=False, pin_memory=False):
    """A new tensor holding a copy of ``data`` (lists, numbers, arrays).

    >>> import distgrad
    >>> distgrad.tensor([1.0, 2.0]).dtype
    distgrad.float32
    """
    if isinstance(data, TensorBase):
        arr = array_of(data).copy() if dtype is None else array_of(data).astype(_dt.to_numpy_dtype(dtype))
    else:
        arr = as_array(data, dtype)
    return _finish(arr, requires_grad, device)


def as_tensor(data, dtype=None, device=None):
    _device.as_cpu_device(device)
    if isinstance(data, TensorBase):
        return data if dtype is None else data.to(dtype)
    if isinstance(data, np.ndarray) and (dtype is None or _dt.to_numpy_dtype(dtype) == data.dtype):
        return from_numpy(data)
    return tensor(data, dtype=dtype)


def from_numpy(ndarray):
    """A tensor sharing memory with ``ndarray`` (no copy)."""
    if not isinstance(ndarray, np.ndarray):
        raise TypeError(f"expected np.ndarray (got {type(ndarray).__name__})")
    _dt.from_numpy_dtype(ndarray.dtype)  # raises for unsupported dtypes
    return wrap(ndarray)


def zeros(*size, dtype=None, device=None, requires_grad=False, out=None):
    return _finish(np.zeros(_size(size), dtype=_float_dtype(dtype)), requires_grad, device)


def ones(*size, dtype=None, device=None, requires_grad=False):
    return _finish(np.ones(_size(size), dtype=_float_dtype(dtype)), requires_grad, device)


def empty(*size, dtype=None, device=None, requires_grad=False, memory_format=None):
    return _finish(np.empty(_size(size), dtype=_float_dtype(dtype)), requires_grad, device)


def full(size, fill_value, *, dtype=None, device=None, requires_grad=False):
    if dtype is None:
        if isinstance(fill_value, bool):
            dtype = _dt.bool
        elif isinstance(fill_value, numbers.Integral):
            dtype = _dt.int64
        elif isinstance(fill_value, numbers.Complex) and not isinstance(fill_value, numbers.Real):
            dtype = _dt.get_default_dtype().to_complex()
    if isinstance(fill_value, TensorBase):
        fill_value = fill_value.item()
    return _finish(np.full(_size((size,)), fill_value, dtype=_float_dtype(dtype)),
                   requires_grad, device)


def arange(start, end=None, step=1, *, dtype=None, device=None, requires_grad=False):
    if end is None:
        start, end = 0, start
    vals = [v.item() if isinstance(v, TensorBase) else v for v in (start, end, step)]
    if step == 0:
        raise RuntimeError("step must be nonzero")
    if dtype is None:
        dtype = _dt.int64 if all(isinstance(v, numbers.Integral) for v in vals) else None
    return _finish(np.arange(*vals, dtype=_float_dtype(dtype)), requires_grad, device)


def linspace(start, end, steps, *, dtype=None, device=None, requires_grad=False):
    return _finish(np.linspace(start, end, int(steps), dtype=_float_dtype(dtype)),
                   requires_grad, device)


def eye(n, m=None, *, dtype=None, device=None, requires_grad=False):
    return _finish(np.eye(n, m, dtype=_float_dtype(dtype)), requires_grad, device)


def rand(*size, generator=None, dtype=None, device=None, requires_grad=False):
    dt = _float_dtype(dtype)
    return _finish(_rng(generator).random(_size(size)).astype(dt, copy=False),
                   requires_grad, device)


def randn(*size, generator=None, dtype=None, device=None, requires_grad=False):
    dt = _float_dtype(dtype)
    shape = _size(size)
    if dt.kind == "c":
        half = np.sqrt(0.5)
        arr = (_rng(generator).standard_normal(shape) * half
               + 1j * _rng(generator).standard_normal(shape) * half).astype(dt)
    else:
        arr = _rng(generator).standard_normal(shape).astype(dt, copy=False)
    return _finish(arr, requires_grad, device)


def randint(low=0, high=None, size=None, *, generator=None, dtype=None, device=None,
            requires_grad=False):
    if high is None:
        low, high = 0, low
    if size is None:
        raise TypeError("randint() missing required argument 'size'")
    dt = _dt.to_numpy_dtype(dtype) if dtype is not None else np.dtype(np.int64)
    return _finish(_rng(generator).integers(low, high, size=_size((size,))).astype(dt),
                   requires_grad, device)


def randperm(n, *, generator=None, dtype=None, device=None, requires_grad=False):
    dt = _dt.to_numpy_dtype(dtype) if dtype is not None else np.dtype(np.int64)
    return _finish(_rng(generator).permutation(n).astype(dt), requires_grad, device)


def normal(mean, std, size=None, *, generator=None, dtype=None):
    if size is None:
        shape = np.broadcast_shapes(np.shape(getattr(mean, "_data", mean)),
                                    np.shape(getattr(std, "_data", std)))
    else:
        shape = _size((size,))
    m = getattr(mean, "_data", mean)
    s = getattr(std, "_data", std)
    arr = _rng(generator).normal(m, s, size=shape)
    return wrap(arr.astype(_float_dtype(dtype), copy=False))


def _like(input, dtype):
    return array_of(input).dtype if dtype is None else _dt.to_numpy_dtype(dtype)


def zeros_like(input, *, dtype=None, device=None, requires_grad=False, memory_format=None):
    return _finish(np.zeros(array_of(input).shape, dtype=_like(input, dtype)), requires_grad, device)


def ones_like(input, *, dtype=None, device=None, requires_grad=False, memory_format=None):
    return _finish(np.ones(array_of(input).shape, dtype=_like(input, dtype)), requires_grad, device)


def empty_like(input, *, dtype=None, device=None, requires_grad=False, memory_format=None):
    return _finish(np.empty(array_of(input).shape, dtype=_like(input, dtype)), requires_grad, device)


def full_like(input, fill_value, *, dtype=None, device=None, requires_grad=False):
    return _finish(np.full(array_of(input).shape, fill_value, dtype=_like(input, dtype)),
                   requires_grad, device)


def rand_like(input, *, dtype=None, device=None, requires_grad=False):
    return rand(*array_of(input).shape, dtype=dtype or input.dtype, device=device,
               requires_grad=requires_grad)


def randn_like(input, *, dtype=None, device=None, requires_grad=False):
    return randn(*array_of(input).shape, dtype=dtype or input.dtype, device=device,
               requires_grad=requires_grad)


def randint_like(input, low=0, high=None, *, dtype=None, device=None, requires_grad=False):
    return randint(low, high, array_of(input).shape, dtype=dtype or input.dtype, device=device,
                   requires_grad=requires_grad)

"""The tensor core: a NumPy array plus the autograd state PyTorch keeps beside it.

:class:`TensorBase` is what autograd itself needs: leaves and non-leaves, ``.grad``,
hooks, version counters, views, conversions (PyTorch's ``torch._C.TensorBase``). The
class programs use, ``distgrad.Tensor``, is assembled from it and the method sets of the
layers above (``distgrad/_tensor.py``: operators and math from ``distgrad.ops``, sparse
layouts, shared memory, printing, ``backward``), which registers itself here with
:func:`install_tensor_type`: every tensor autograd makes is one, and so is what
``TensorBase(...)`` (``autograd.Variable(...)``) builds.
"""
import warnings
from collections import OrderedDict

import numpy as np

from . import dtype as _dt
from .device import CPU_ONLY as _CPU_ONLY, cpu as _cpu_device
from .grad_mode import _state, inference_threads as _inference_threads
from ..utils.hooks import RemovableHandle
from .. import codec as _codec
from .naming import public_name

__all__ = ["TensorBase", "is_tensor", "ArrayStorage", "install_tensor_type"]


class ArrayStorage:
    """Base of the arrays a Tensor may hold besides ``numpy.ndarray``: a sparse COO array
    (``distgrad/sparse``). Such a storage speaks NumPy's array protocols for what it
    supports and raises for the rest; a Tensor keeps it as it is (never ``np.asarray``)."""

    __slots__ = ()


class TensorBase:
    # Hot fields are slots, set by every op; the rest are class-level defaults that
    # land in the instance __dict__ only on the tensors that need them (leaves with
    # hooks, views, inference tensors), so creating a tensor stays cheap.
    __slots__ = ("_data", "_requires_grad", "_grad_fn", "_output_nr", "_grad", "_vc", "_base",
                 "__weakref__", "__dict__")
    _view_fn = None
    _retains_grad = False
    _hooks = None
    _post_acc_hooks = None
    _grad_accumulator = None
    _is_inference = False

    # Tensors are hashed by identity, as in PyTorch (``==`` is elementwise).
    __hash__ = object.__hash__
    # NumPy must defer to our reflected operators (``ndarray * Tensor``).
    __array_priority__ = 1000

    def __new__(cls, *args, **kwargs):
        # The core is never made on its own: TensorBase(...) builds a distgrad.Tensor.
        return object.__new__(_tensor_type if cls is TensorBase else cls)

    def __init__(self, *args, device=None):
        # PyTorch's legacy constructor: Tensor() is empty, Tensor(2, 3) uninitialised of that
        # shape, Tensor([1, 2]) data in the default dtype, Tensor(t) an alias of t.
        # New code uses distgrad.tensor/zeros/empty; the fast path is _make.
        if len(args) == 1 and isinstance(args[0], TensorBase):
            src = args[0]
            _init(self, src._data, None, 0, False, src._vc)
            return
        _init(self, _legacy_array(args, _dt.get_default_dtype().numpy), None, 0, False, None)

    @staticmethod
    def _wrap(array, requires_grad=False):
        """Wrap an ndarray without copying (used by the wire codec and tests)."""
        t = _make(np.asarray(array))
        if requires_grad:
            t.requires_grad_(True)
        return t

    # ------------------------------------------------------------ properties
    @property
    def data(self):
        """A tensor sharing this one's storage, detached, with a separate version counter."""
        return _make(self._data)

    @data.setter
    def data(self, value):
        self._data = value._data if isinstance(value, TensorBase) else np.asarray(value)

    @property
    def shape(self):
        return Size(self._data.shape)

    def size(self, dim=None):
        if dim is None:
            return Size(self._data.shape)
        return self._data.shape[_wrap_dim(dim, self._data.ndim)]

    @property
    def dtype(self):
        return _dt.from_numpy_dtype(self._data.dtype)

    @property
    def ndim(self):
        return self._data.ndim

    def dim(self):
        return self._data.ndim

    def numel(self):
        return int(self._data.size)

    nelement = numel

    @property
    def device(self):
        return _cpu_device

    def cuda(self, device=None, non_blocking=False, memory_format=None):
        raise RuntimeError(f"{_CPU_ONLY}: Tensor.cuda() is not available (tensors stay on 'cpu')")

    @property
    def is_cuda(self):
        return False

    def element_size(self):
        return self._data.itemsize

    def stride(self, dim=None):
        strides = tuple(s // self._data.itemsize for s in self._data.strides)
        return strides if dim is None else strides[_wrap_dim(dim, self._data.ndim)]

    def is_contiguous(self):
        return bool(self._data.flags.c_contiguous)

    def is_floating_point(self):
        return self._data.dtype.kind == "f"

    def is_complex(self):
        return self._data.dtype.kind == "c"

    def is_inference(self):
        return self._is_inference

    @property
    def _version(self):
        return self._vc[0]

    @property
    def is_leaf(self):
        return self._grad_fn is None

    @property
    def grad_fn(self):
        return self._grad_fn

    @property
    def output_nr(self):
        return self._output_nr

    @property
    def _base_tensor(self):
        return self._base

    def _is_view(self):
        return self._base is not None

    @property
    def requires_grad(self):
        return self._requires_grad

    @requires_grad.setter
    def requires_grad(self, value):
        self.requires_grad_(value)

    def requires_grad_(self, requires_grad=True):
        requires_grad = bool(requires_grad)
        if self._grad_fn is not None:
            if not requires_grad:
                raise RuntimeError(
                    "you can only change requires_grad flags of leaf variables. If you want to "
                    "use a computed variable in a subgraph that doesn't require differentiation "
                    "use var_no_grad = var.detach().")
            return self
        kind = self._data.dtype.kind
        if requires_grad and kind not in "fc":
            raise RuntimeError("only Tensors of floating point and complex dtype can require "
                               f"gradients (got {self.dtype!r})")
        if requires_grad and self._is_inference:
            raise RuntimeError("Setting requires_grad=True on inference tensor outside "
                               "InferenceMode is not allowed.")
        self._requires_grad = requires_grad
        return self

    @property
    def grad(self):
        if self._grad_fn is not None and not self._retains_grad and self._grad is None:
            warnings.warn(
                "The .grad attribute of a Tensor that is not a leaf Tensor is being accessed. Its "
                ".grad attribute won't be populated during autograd.backward(). If you indeed "
                "want the .grad field to be populated for a non-leaf Tensor, use .retain_grad() "
                "on the non-leaf Tensor.", UserWarning, stacklevel=2)
        return self._grad

    @grad.setter
    def grad(self, value):
        if value is not None:
            if not isinstance(value, TensorBase):
                raise TypeError(f"assigned grad expected to be a Tensor or None but got grad "
                                f"of type {type(value).__name__}")
            if value._data.shape != self._data.shape:
                raise RuntimeError(
                    f"assigned grad has data of a different size: grad is {tuple(value.shape)}, "
                    f"tensor is {tuple(self.shape)}")
            if value._data.dtype != self._data.dtype:
                raise RuntimeError(f"assigned grad has data of a different type: grad is "
                                   f"{value.dtype!r}, tensor is {self.dtype!r}")
        self._grad = value

    @grad.deleter
    def grad(self):
        self._grad = None

    @property
    def retains_grad(self):
        return self._retains_grad

    # ------------------------------------------------------------ hooks
    def register_hook(self, hook):
        """``hook(grad) -> Tensor | None`` runs when this tensor's gradient is computed.

        On a leaf it runs before accumulation and ``.grad`` gets its result; on a
        non-leaf the result flows on. Hooks run in registration order.

        >>> import distgrad
        >>> x = distgrad.ones(3, requires_grad=True)
        >>> h = x.register_hook(lambda g: g * 2)
        >>> x.sum().backward(); x.grad.tolist()
        [2.0, 2.0, 2.0]
        """
        if not self._requires_grad:
            raise RuntimeError("cannot register a hook on a tensor that doesn't require gradient")
        if self._grad_fn is not None:
            return self._grad_fn._register_tensor_pre_hook(self._output_nr, hook)
        if self._hooks is None:
            self._hooks = OrderedDict()
        handle = RemovableHandle(self._hooks)
        self._hooks[handle.id] = hook
        return handle

    def register_post_accumulate_grad_hook(self, hook):
        """``hook(tensor)`` runs after ``.grad`` of this leaf was updated."""
        if self._grad_fn is not None:
            raise RuntimeError("post accumulate grad hooks cannot be registered on non-leaf tensors")
        if not self._requires_grad:
            raise RuntimeError("cannot register a hook on a tensor that doesn't require gradient")
        if self._post_acc_hooks is None:
            self._post_acc_hooks = OrderedDict()
        handle = RemovableHandle(self._post_acc_hooks)
        self._post_acc_hooks[handle.id] = hook
        return handle

    # ------------------------------------------------------------ autograd
    def detach(self):
        """A new tensor on the same storage (and version counter), cut from the graph."""
        t = _make(self._data, vc=self._vc)
        return t

    def detach_(self):
        if self._base is not None:
            raise RuntimeError("Can't detach views in-place. Use detach() instead.")
        self._grad_fn = None
        self._output_nr = 0
        self._requires_grad = False
        return self

    # ------------------------------------------------------------ conversion
    def numpy(self, *, force=False):
        if type(self._data) is not np.ndarray and isinstance(self._data, ArrayStorage):
            raise TypeError(f"can't convert {self.layout} layout tensor to numpy. Use "
                            "Tensor.to_dense() first.")
        if self._requires_grad and not force:
            raise RuntimeError("Can't call numpy() on Tensor that requires grad. "
                               "Use tensor.detach().numpy() instead.")
        return self._data

    def __array__(self, dtype=None, copy=None):
        arr = self.numpy()
        return arr if dtype is None else arr.astype(dtype, copy=False)

    def item(self):
        if self._data.size != 1:
            raise RuntimeError(f"a Tensor with {self._data.size} elements cannot be converted "
                               "to Scalar")
        return self._data.reshape(()).item()

    def tolist(self):
        return self._data.tolist()

    def __float__(self):
        return float(self.item())

    def __int__(self):
        return int(self.item())

    def __complex__(self):
        return complex(self.item())

    def __index__(self):
        if self._data.dtype.kind not in "iub" or self._data.size != 1:
            raise TypeError("only integer tensors of a single element can be converted to an index")
        return int(self.item())

    def __bool__(self):
        if self._data.size != 1:
            raise RuntimeError("Boolean value of Tensor with more than one value is ambiguous")
        return bool(self._data.reshape(()).item())

    def __len__(self):
        if self._data.ndim == 0:
            raise TypeError("len() of a 0-d tensor")
        return self._data.shape[0]

    def __iter__(self):
        if self._data.ndim == 0:
            raise TypeError("iteration over a 0-d tensor")
        return iter(self.unbind(0))

    def __reduce_ex__(self, protocol):
        # For copy.copy; the RPC wire and checkpoints have their own codec (distgrad/codec.py).
        return (_rebuild, (self._data.copy(), self._requires_grad))

    def __deepcopy__(self, memo):
        if self._grad_fn is not None:
            raise RuntimeError("Only Tensors created explicitly by the user (graph leaves) "
                               "support the deepcopy protocol at the moment.")
        new = type(self).__new__(type(self))
        _init(new, self._data.copy(), None, 0, self._requires_grad, None)
        if self.__dict__:
            import copy
            new.__dict__.update(copy.deepcopy(self.__dict__, memo))
        if self._grad is not None:
            new._grad = self._grad.__deepcopy__(memo)
        memo[id(self)] = new
        return new


# The class every tensor is made of: distgrad.Tensor once distgrad/_tensor.py has
# assembled it (which happens when the distgrad package is imported, before any tensor).
_tensor_type = TensorBase


def install_tensor_type(cls):
    """Make tensors of ``cls`` (``distgrad.Tensor``, a subclass of :class:`TensorBase`)."""
    global _tensor_type
    _tensor_type = cls


def __getattr__(name):
    # ``distgrad.autograd.tensor.Tensor``: the class's old home still names it
    if name == "Tensor":
        return _tensor_type
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _rebuild(data, requires_grad):
    t = _make(data)
    t._requires_grad = requires_grad
    return t


class Size(tuple):
    """``tensor.shape``: a tuple that prints as ``distgrad.Size([2, 3])``."""

    def __repr__(self):
        return f"{public_name()}.Size({list(self)})"

    def numel(self):
        n = 1
        for s in self:
            n *= s
        return n


def _init(t, data, grad_fn, output_nr, requires_grad, vc):
    if type(data) is not np.ndarray and not isinstance(data, ArrayStorage):
        data = np.asarray(data)  # NumPy gives scalars for 0-d results; keep arrays
    t._data = data
    t._grad_fn = grad_fn
    t._output_nr = output_nr
    t._requires_grad = requires_grad
    t._grad = None
    t._vc = vc if vc is not None else [0]
    t._base = None
    # Only while some thread is inside inference_mode is the thread-local flag read.
    if _inference_threads[0] and _state.inference:
        t._is_inference = True


def _make(data, grad_fn=None, output_nr=0, requires_grad=False, vc=None, cls=None):
    """Wrap an ndarray as a Tensor without copying: the hot path of every op."""
    t = object.__new__(cls or _tensor_type)
    _init(t, data, grad_fn, output_nr, requires_grad, vc)
    return t


def _as_array(data, dtype=None):
    """Convert Python data to an ndarray with PyTorch's dtype inference."""
    np_dtype = _dt.to_numpy_dtype(dtype) if dtype is not None else None
    if isinstance(data, np.ndarray):
        return np.array(data, dtype=np_dtype, copy=True)
    if isinstance(data, (list, tuple)) and \
            any(isinstance(x, TensorBase) for x in _flatten(data)):
        data = _tensors_to_lists(data)
    arr = np.array(data, dtype=np_dtype)
    if np_dtype is None:
        kind = arr.dtype.kind
        if kind == "f":
            arr = arr.astype(_dt.get_default_dtype().numpy, copy=False)
        elif kind == "c":
            arr = arr.astype(_dt.get_default_dtype().to_complex().numpy, copy=False)
        elif kind in "iu" and arr.dtype != np.uint8:
            arr = arr.astype(np.int64, copy=False)
        elif kind not in "b":
            raise TypeError(f"Could not infer dtype of {type(data).__name__}")
    return arr


def _legacy_array(args, np_dtype):
    """The array of a legacy constructor call (``Tensor(...)``, ``FloatTensor(...)``,
    ``x.new(...)``): no argument is an empty tensor; integers (or one ``Size``) are a
    shape, left uninitialised; one other argument is data, converted to ``np_dtype``."""
    if not args:
        return np.empty((0,), dtype=np_dtype)
    first = args[0]
    is_shape = len(args) > 1 or isinstance(first, Size) or (
        isinstance(first, (int, np.integer)) and not isinstance(first, bool))
    if not is_shape:
        data = first
        if isinstance(data, (list, tuple)) and \
            any(isinstance(x, TensorBase) for x in _flatten(data)):
            data = _tensors_to_lists(data)
        return np.array(data, dtype=np_dtype)
    shape = tuple(first) if isinstance(first, Size) else args
    for pos, n in enumerate(shape):
        if isinstance(n, bool) or not isinstance(n, (int, np.integer)):
            raise TypeError(f"new(): argument 'size' failed to unpack the object at pos "
                            f"{pos + 1} with error \"type must be tuple of ints,but got "
                            f"{type(n).__name__}\"")
        if n < 0:
            raise RuntimeError(f"Trying to create tensor with negative dimension {n}: "
                               f"{list(shape)}")
    return np.empty(shape, dtype=np_dtype)


def _flatten(data):
    for x in data:
        if isinstance(x, (list, tuple)):
            yield from _flatten(x)
        else:
            yield x


def _tensors_to_lists(data):
    if isinstance(data, TensorBase):
        return data._data.tolist()
    if isinstance(data, (list, tuple)):
        return [_tensors_to_lists(x) for x in data]
    return data


def _wrap_dim(dim, ndim):
    n = max(ndim, 1)
    if not -n <= dim < n:
        raise IndexError(f"Dimension out of range (expected to be in range of [{-n}, {n - 1}], "
                         f"but got {dim})")
    return dim % n


def _describe(array):
    names = {"float32": "FloatTensor", "float64": "DoubleTensor", "complex64": "ComplexFloatTensor",
             "complex128": "ComplexDoubleTensor", "int64": "LongTensor", "bool": "BoolTensor"}
    return f"{public_name()}.{names.get(array.dtype.name, array.dtype.name)} {list(array.shape)}"


def is_tensor(obj):
    return isinstance(obj, TensorBase)


# ---------------------------------------------------------------- the value codec
# Tensors travel (RPC, checkpoints, the activation store) as their array plus
# requires_grad; a received tensor is a new leaf over a read-only view of the bytes.
# A tensor whose storage is not an ndarray (sparse) travels as [storage, requires_grad]:
# the storage is a codec type of its own.
def _encode_tensor(t, enc):
    data = t._data
    if type(data) is not np.ndarray and isinstance(data, ArrayStorage):
        return [data, bool(t._requires_grad)]
    return enc.array(np.asarray(data)) + [bool(t._requires_grad)]


def _decode_tensor(payload, dec):
    if type(payload) is list and len(payload) == 2 and isinstance(payload[0], ArrayStorage):
        t = _make(payload[0])
        if payload[1] is True:
            t.requires_grad_(True)
        return t
    if type(payload) is not list or len(payload) != 4:
        raise _codec.CodecError("malformed tensor")
    return TensorBase._wrap(dec.array(payload), requires_grad=payload[3] is True)


_codec.register(TensorBase, 6, _encode_tensor, _decode_tensor)

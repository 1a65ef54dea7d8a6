"""The array behind a sparse COO tensor, speaking NumPy's array protocols.

A sparse tensor is a :class:`~distgrad.Tensor` whose storage is a :class:`COO`
instead of an ``ndarray``: ``indices`` (int64, ``sparse_dim x nnz``), ``values``
(``nnz x dense dims``), the full ``shape``, and whether it is known to be coalesced
(indices sorted and unique), as PyTorch keeps them.

The ops of ``distgrad.ops`` compute on a tensor's array with NumPy functions. A
:class:`COO` answers those functions itself (NEP 13 ``__array_ufunc__`` and NEP 18
``__array_function__``, as pydata/sparse does) with PyTorch's sparse rules: sparse
+ sparse is sparse, dense + sparse is dense, sparse * dense is sparse, sparse @
dense is dense, ``stack``/``cat`` of sparse tensors are sparse. The gradient rules
of those ops run on the same protocols, so gradients come out sparse exactly where
PyTorch's do. Everything else raises ``NotImplementedError`` naming the operation,
as PyTorch's "Could not run ... with arguments from the 'SparseCPU' backend": a
sparse tensor is never turned dense behind the caller's back (``np.asarray`` on one
raises too; ``to_dense()`` is the explicit way). The rules of the ufuncs live in
``coo_arithmetic.py``, those of the array functions in ``coo_array_functions.py``.
"""
import numbers

import numpy as np

from .. import codec
from ..autograd.tensor import ArrayStorage

__all__ = ["COO", "SparseNotImplemented", "unsupported", "from_dense"]

#: The codec's extension type of a COO array (a sparse tensor travels as this plus
#: ``requires_grad``).
CODEC_CODE = 15

#: The NumPy ufuncs and array functions a COO answers, by function: coo_arithmetic.py and
#: coo_array_functions.py fill them (``distgrad.sparse`` imports both).
_UFUNCS = {}
_FUNCTIONS = {}


class SparseNotImplemented(NotImplementedError, AttributeError):
    """An array operation that sparse tensors do not support. It is also an
    AttributeError, so that ``hasattr``/``getattr(x, name, default)`` probing an array
    attribute a COO lacks answers as for any missing attribute."""


def unsupported(what):
    return SparseNotImplemented(
        f"Could not run '{what}' with arguments from the 'SparseCPU' backend: distgrad does not "
        "support it on sparse COO tensors (call .to_dense() first if a dense result is meant)")


class _Flags:
    """The one ndarray flag code may set on a storage (``writeable``: read-only views)."""
    __slots__ = ("writeable",)

    def __init__(self):
        self.writeable = True


def _scalar(x):
    """The number a Python/NumPy scalar or 0-d array stands for, else None."""
    if isinstance(x, (numbers.Number, np.generic)) and not isinstance(x, bool):
        return x
    if isinstance(x, np.ndarray) and x.ndim == 0:
        return x
    return None


def _shape_text(shape):
    return f"[{', '.join(str(s) for s in shape)}]"


class COO(ArrayStorage):
    """``indices`` (int64 ``[sparse_dim, nnz]``), ``values`` (``[nnz, *dense_shape]``),
    ``shape``; ``coalesced``: indices known sorted and unique."""

    __slots__ = ("indices", "values", "_shape", "coalesced", "flags")

    def __init__(self, indices, values, shape, coalesced=False):
        self.indices = indices
        self.values = values
        self._shape = tuple(int(s) for s in shape)
        self.coalesced = bool(coalesced)
        self.flags = _Flags()

    # ------------------------------------------------------------ array attributes
    @property
    def shape(self):
        return self._shape

    @shape.setter
    def shape(self, value):
        # ndarray's in-place reshape (how ops.view makes a view): no such view of a COO
        raise NotImplementedError("Could not run 'view' with arguments from the 'SparseCPU' "
                                  "backend: a sparse tensor has no strided views (distgrad)")

    @property
    def ndim(self):
        return len(self.shape)

    @property
    def dtype(self):
        return self.values.dtype

    @property
    def size(self):
        """The number of elements of the dense tensor (``numel``), as PyTorch counts them."""
        n = 1
        for s in self.shape:
            n *= s
        return n

    @property
    def itemsize(self):
        return self.values.itemsize

    @property
    def sparse_dim(self):
        return self.indices.shape[0]

    @property
    def dense_dim(self):
        return self.values.ndim - 1

    @property
    def nnz(self):
        return self.indices.shape[1]

    @property
    def T(self):  # noqa: N802 - ndarray's name
        if self.ndim != 2:
            raise unsupported("t (of a sparse tensor that is not 2-D)")
        return _permute(self, (1, 0))

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        raise unsupported(name)

    def __array__(self, dtype=None, copy=None):
        raise unsupported("a dense NumPy array of a sparse tensor")

    def __getitem__(self, key):
        raise unsupported("indexing")

    def __setitem__(self, key, value):
        raise unsupported("in-place writes")

    def __bool__(self):
        raise unsupported("the truth value of a sparse tensor")

    def __eq__(self, other):
        return np.equal(self, other)

    def __ne__(self, other):
        return np.not_equal(self, other)

    def __lt__(self, other):
        return np.less(self, other)

    def __le__(self, other):
        return np.less_equal(self, other)

    def __gt__(self, other):
        return np.greater(self, other)

    def __ge__(self, other):
        return np.greater_equal(self, other)

    __hash__ = None

    def __len__(self):
        if not self.shape:
            raise TypeError("len() of a 0-d tensor")
        return self.shape[0]

    def __repr__(self):
        return (f"COO(shape={self.shape}, nnz={self.nnz}, dtype={self.dtype}, "
                f"coalesced={self.coalesced})")

    # ------------------------------------------------------------ methods ops call
    def copy(self):
        return COO(self.indices.copy(), self.values.copy(), self.shape, self.coalesced)

    def view(self):
        """A COO sharing this one's index and value arrays (with flags of its own)."""
        return COO(self.indices, self.values, self.shape, self.coalesced)

    def astype(self, dtype, copy=True):
        dtype = np.dtype(dtype)
        if dtype == self.values.dtype and not copy:
            return self
        return COO(self.indices, self.values.astype(dtype), self.shape, self.coalesced)

    def conj(self):
        if self.values.dtype.kind != "c":
            return self
        return COO(self.indices, self.values.conj(), self.shape, self.coalesced)

    conjugate = conj

    def sum(self, axis=None, dtype=None, keepdims=False, out=None):
        """The sum of all elements (a dense 0-d result); partial sums: ``torch.sparse.sum``."""
        axes = tuple(range(self.ndim)) if axis is None else \
            tuple(a % max(self.ndim, 1) for a in ((axis,) if isinstance(axis, int) else axis))
        if out is not None or sorted(axes) != list(range(self.ndim)):
            raise unsupported("sum over some dimensions (torch.sparse.sum does it)")
        total = np.asarray(self.values.sum(dtype=dtype))
        return total.reshape((1,) * self.ndim) if keepdims else total

    def coalesce(self):
        """Indices sorted and unique, the values of repeated indices summed."""
        if self.coalesced:
            return self
        linear = _linear(self.indices, self.shape)
        order = np.argsort(linear, kind="stable")
        linear = linear[order]
        if linear.size:
            first = np.concatenate(([True], linear[1:] != linear[:-1]))
        else:
            first = np.zeros(0, dtype=bool)
        starts = np.flatnonzero(first)
        values = self.values[order]
        if values.shape[0]:
            values = np.add.reduceat(values, starts, axis=0)
        return COO(self.indices[:, order][:, starts], values.astype(self.dtype, copy=False),
                   self.shape, True)

    def to_dense(self):
        out = np.zeros(self.shape, dtype=self.dtype)
        if self.nnz:
            np.add.at(out, tuple(self.indices), self.values)
        return out

    # ------------------------------------------------------------ Python operators
    # Used by the engine on raw gradients: a sum of two gradients is order-free
    # (dense + sparse, sparse + dense: dense), unlike torch.add(sparse, dense).
    def __add__(self, other):
        if isinstance(other, np.ndarray):  # np.add's rule, without the ufunc dispatch
            return _UFUNCS[np.add](other, self)
        return np.add(self, other)

    def __radd__(self, other):
        return np.add(other, self)

    def __sub__(self, other):
        return np.subtract(self, other)

    def __rsub__(self, other):
        return np.subtract(other, self)

    def __mul__(self, other):
        return np.multiply(self, other)

    __rmul__ = __mul__

    def __truediv__(self, other):
        return np.true_divide(self, other)

    def __pow__(self, other):
        return np.power(self, other)

    def __neg__(self):
        return np.negative(self)

    def __abs__(self):
        return np.absolute(self)

    def __matmul__(self, other):
        return np.matmul(self, other)

    def __rmatmul__(self, other):
        return np.matmul(other, self)

    # ------------------------------------------------------------ NumPy's protocols
    def __array_ufunc__(self, ufunc, method, *inputs, **kwargs):
        if method == "reduce" and ufunc is np.add:
            raise unsupported("a sum over some dimensions (torch.sparse.sum does it)")
        if method != "__call__" or kwargs.get("out") is not None:
            raise unsupported(f"{ufunc.__name__}.{method}" if method != "__call__"
                              else f"{ufunc.__name__} with out=")
        handler = _UFUNCS.get(ufunc)
        if handler is None:
            raise unsupported(ufunc.__name__)
        return handler(*inputs)

    def __array_function__(self, func, types, args, kwargs):
        handler = _FUNCTIONS.get(func)
        if handler is None:
            raise unsupported(getattr(func, "__name__", str(func)))
        return handler(*args, **kwargs)



def _linear(indices, shape):
    """Row-major linear positions of ``indices`` over the sparse dimensions of ``shape``."""
    sparse_shape = shape[:indices.shape[0]]
    if not sparse_shape:
        return np.zeros(indices.shape[1], dtype=np.int64)
    return np.ravel_multi_index(tuple(indices), sparse_shape).astype(np.int64, copy=False)


def from_dense(a, sparse_dim=None):
    """The coalesced COO of ndarray ``a`` (its non-zero entries; with ``sparse_dim`` below
    ``a.ndim``, the non-zero slices of its leading dimensions)."""
    sparse_dim = a.ndim if sparse_dim is None else sparse_dim
    if sparse_dim == a.ndim:
        indices = np.array(np.nonzero(a), dtype=np.int64).reshape(a.ndim, -1)
        values = a[tuple(indices)]
    else:
        lead = a.reshape(a.shape[:sparse_dim] + (-1,))
        nz = np.any(lead != 0, axis=-1)
        indices = np.array(np.nonzero(nz), dtype=np.int64).reshape(sparse_dim, -1)
        values = a[tuple(indices)]
    return COO(indices, np.ascontiguousarray(values), a.shape, True)



def _permute(a, axes):
    axes = [x % a.ndim for x in axes]
    sparse = a.sparse_dim
    if sorted(axes[:sparse]) != list(range(sparse)):
        raise unsupported("a permutation mixing sparse and dense dimensions")
    dense_axes = [0] + [x - sparse + 1 for x in axes[sparse:]]
    values = a.values if dense_axes == sorted(dense_axes) else np.transpose(a.values, dense_axes)
    keep_order = axes[:sparse] == list(range(sparse))
    return COO(a.indices[axes[:sparse]], values, [a.shape[x] for x in axes],
               a.coalesced and keep_order)



# ---------------------------------------------------------------------- the wire
def _encode(a, enc):
    return [enc.array(np.ascontiguousarray(a.indices)), enc.array(np.ascontiguousarray(a.values)),
            list(a.shape), a.coalesced]


def _decode(payload, dec):
    """A COO from a peer: every index checked against the shape before it is used."""
    if type(payload) is not list or len(payload) != 4 or type(payload[3]) is not bool:
        raise codec.CodecError("malformed sparse COO array")
    indices, values = dec.array(payload[0]), dec.array(payload[1])
    shape = payload[2]
    if type(shape) is not list or not all(type(s) is int and s >= 0 for s in shape):
        raise codec.CodecError(f"malformed sparse COO shape {shape!r}")
    if indices.dtype != np.int64 or indices.ndim != 2 or values.ndim < 1 or \
            values.shape[0] != indices.shape[1] or \
            indices.shape[0] + values.ndim - 1 != len(shape) or \
            tuple(values.shape[1:]) != tuple(shape[indices.shape[0]:]):
        raise codec.CodecError(f"sparse COO array with indices of shape {indices.shape} and "
                               f"values of shape {values.shape} does not fit shape {shape}")
    if indices.size and ((indices < 0).any() or
                         (indices >= np.array(shape[:indices.shape[0]])[:, None]).any()):
        raise codec.CodecError(f"sparse COO array has indices outside its shape {shape}")
    coalesced = payload[3]
    if coalesced:  # a peer's claim that is cheap to check and costly to believe wrongly
        linear = _linear(indices, tuple(shape))
        coalesced = bool(np.all(linear[1:] > linear[:-1]))
    return COO(indices, values, shape, coalesced)


codec.register(COO, CODEC_CODE, _encode, _decode)

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
raises too; ``to_dense()`` is the explicit way).
"""
import numbers

import numpy as np

from .. import codec
from ..autograd.tensor import ArrayStorage

__all__ = ["COO", "SparseNotImplemented", "unsupported", "from_dense"]

#: The codec's extension type of a COO array (a sparse tensor travels as this plus
#: ``requires_grad``).
CODEC_CODE = 15


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
        if isinstance(other, np.ndarray):
            return _add(other, self, 1)
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


# ---------------------------------------------------------------------- helpers
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


def _same_shape(op, x, y):
    if x.shape != y.shape:
        raise RuntimeError(f"{op}: expected 'self' and 'other' to have same size, but self has "
                           f"size {_shape_text(x.shape)} while other has size "
                           f"{_shape_text(y.shape)} (FYI: op2-sparse addition does not currently "
                           "support broadcasting)")


def _result_dtype(x, y):
    return np.result_type(x.dtype, y.dtype) if x.dtype != y.dtype else x.dtype


def _add(x, y, sign):
    """``x + sign * y`` for the (sparse/dense) combinations PyTorch allows."""
    op = "add" if sign > 0 else "sub"
    if isinstance(x, COO) and isinstance(y, COO):
        _same_shape(op, x, y)
        if x.sparse_dim != y.sparse_dim:
            raise RuntimeError(f"{op}: expected 'self' and 'other' to have same sparse "
                               f"dimensions, but got {x.sparse_dim} and {y.sparse_dim}")
        dt = _result_dtype(x, y)
        yv = y.values if sign > 0 else -y.values
        merged = COO(np.concatenate([x.indices, y.indices], axis=1),
                     np.concatenate([x.values.astype(dt, copy=False), yv.astype(dt, copy=False)]),
                     x.shape, False)
        # Two coalesced operands merge into a coalesced sum (PyTorch's contiguous path);
        # otherwise the result keeps both entry lists (its non-contiguous path).
        return merged.coalesce() if x.coalesced and y.coalesced else merged
    if isinstance(y, COO) and isinstance(x, np.ndarray) and x.ndim:
        _same_shape(op, x, y)
        out = np.array(x, dtype=_result_dtype(x, y), copy=True)
        if y.nnz:
            np.add.at(out, tuple(y.indices), y.values if sign > 0 else -y.values)
        return out
    if isinstance(x, COO) and isinstance(y, np.ndarray) and y.ndim:
        raise RuntimeError(f"{op}(sparse, dense) is not supported. Use {op}(dense, sparse) "
                           "instead.")
    raise unsupported(f"{op} of a sparse tensor and a number (the result would be dense)")


def _gather(x, indices):
    """The values of coalesced ``x`` at ``indices`` (zeros where ``x`` has no entry)."""
    x = x.coalesce()
    have = _linear(x.indices, x.shape)
    want = _linear(indices, x.shape)
    pos = np.searchsorted(have, want)
    pos_ok = np.minimum(pos, max(have.size - 1, 0))
    hit = (pos < have.size) & (have[pos_ok] == want) if have.size else \
        np.zeros(want.shape, dtype=bool)
    out = np.zeros((want.size,) + x.values.shape[1:], dtype=x.dtype)
    out[hit] = x.values[pos_ok[hit]]
    return out


def _multiply(x, y):
    s = _scalar(y) if isinstance(x, COO) else _scalar(x)
    sp, other = (x, y) if isinstance(x, COO) else (y, x)
    if s is not None:
        values = sp.values * s
        return COO(sp.indices, values, sp.shape, sp.coalesced)
    if isinstance(other, COO):
        _same_shape("mul", sp, other)
        a, b = sp.coalesce(), other.coalesce()
        common, ia, ib = np.intersect1d(_linear(a.indices, a.shape), _linear(b.indices, b.shape),
                                        assume_unique=True, return_indices=True)
        return COO(a.indices[:, ia], a.values[ia] * b.values[ib], a.shape, True)
    if isinstance(other, np.ndarray):
        if other.shape != sp.shape:
            raise RuntimeError(f"mul: a sparse tensor of size {_shape_text(sp.shape)} times a "
                               f"dense one of size {_shape_text(other.shape)}: distgrad "
                               "multiplies equal sizes only")
        return COO(sp.indices, sp.values * other[tuple(sp.indices)], sp.shape, sp.coalesced)
    raise unsupported(f"mul with {type(other).__name__}")


def _divide(x, y):
    s = _scalar(y)
    if not isinstance(x, COO) or s is None:
        raise unsupported("div (only a sparse tensor divided by a number keeps its zeros)")
    return COO(x.indices, x.values / s, x.shape, x.coalesced)


def _power(x, e):
    s = _scalar(e)
    if not isinstance(x, COO) or s is None or not np.all(np.real(s) > 0):
        raise unsupported("pow (only a sparse tensor to a positive power keeps its zeros)")
    return COO(x.indices, x.values ** s, x.shape, x.coalesced)


def _elementwise(fn):
    """A ufunc with f(0) == 0, applied to the stored values."""
    def apply(x):
        return COO(x.indices, fn(x.values), x.shape, x.coalesced)
    return apply


def _matmul(x, y):
    if isinstance(x, COO) and isinstance(y, COO):
        raise unsupported("matmul of two sparse tensors (torch.sparse.mm)")
    if isinstance(x, COO):
        if x.ndim != 2 or x.dense_dim or not isinstance(y, np.ndarray) or y.ndim not in (1, 2):
            raise unsupported("matmul of a sparse tensor that is not a 2-D matrix, or with a "
                              "batch")
        if x.shape[1] != y.shape[0]:
            raise RuntimeError(f"mat1 and mat2 shapes cannot be multiplied ({x.shape[0]}x"
                               f"{x.shape[1]} and {'x'.join(str(s) for s in y.shape)})")
        rows, cols = x.indices
        dt = _result_dtype(x, y)
        contrib = y[cols] * (x.values[:, None] if y.ndim == 2 else x.values)
        return _segment_sum(rows, contrib.astype(dt, copy=False), x.shape[0])
    if not isinstance(x, np.ndarray) or x.ndim not in (1, 2):
        raise unsupported("matmul of a batch with a sparse tensor")
    # x @ S == (S^T @ x^T)^T
    flipped = _matmul(_permute(y, (1, 0)), x.T if x.ndim == 2 else x)
    return flipped.T if flipped.ndim == 2 else flipped


def _segment_sum(rows, contrib, n):
    """``out[r] = sum of contrib[i] where rows[i] == r`` for ``r < n``: one sort (none when
    ``rows`` is already sorted, as in a coalesced matrix) and ``add.reduceat``, which is
    many times faster than ``np.add.at``."""
    out = np.zeros((n,) + contrib.shape[1:], dtype=contrib.dtype)
    if not rows.size:
        return out
    if np.any(rows[1:] < rows[:-1]):
        order = np.argsort(rows, kind="stable")
        rows, contrib = rows[order], contrib[order]
    starts = np.flatnonzero(np.concatenate(([True], rows[1:] != rows[:-1])))
    out[rows[starts]] = np.add.reduceat(contrib, starts, axis=0)
    return out


_UFUNCS = {
    np.add: lambda x, y: _add(x, y, 1),
    np.subtract: lambda x, y: _add(x, y, -1),
    np.multiply: _multiply,
    np.true_divide: _divide,
    np.power: _power,
    np.matmul: _matmul,
    np.negative: _elementwise(np.negative),
    np.positive: _elementwise(np.positive),
    np.conjugate: lambda x: x.conj(),
    np.absolute: _elementwise(np.absolute),
    np.sign: _elementwise(np.sign),
}


# ---------------------------------------------------------------------- array functions
def _all_coo(arrays, what):
    if not all(isinstance(a, COO) for a in arrays):
        raise unsupported(f"{what} of sparse and dense tensors together")
    first = arrays[0]
    for a in arrays[1:]:
        if a.sparse_dim != first.sparse_dim or a.dense_dim != first.dense_dim:
            raise RuntimeError(f"{what}: all sparse tensors must have the same sparse and dense "
                               "dimensions")
    return first


def _concatenate(arrays, axis=0, **kwargs):
    arrays = list(arrays)
    first = _all_coo(arrays, "cat")
    axis = axis % first.ndim
    if axis >= first.sparse_dim:
        raise unsupported("cat along a dense dimension of sparse tensors")
    indices, offset = [], 0
    for a in arrays:
        shifted = a.indices.copy()
        shifted[axis] += offset
        indices.append(shifted)
        offset += a.shape[axis]
    shape = list(first.shape)
    shape[axis] = offset
    dt = np.result_type(*[a.dtype for a in arrays])
    return COO(np.concatenate(indices, axis=1),
               np.concatenate([a.values.astype(dt, copy=False) for a in arrays]), shape, False)


def _stack(arrays, axis=0, **kwargs):
    arrays = list(arrays)
    first = _all_coo(arrays, "stack")
    axis = axis % (first.ndim + 1)
    if axis > first.sparse_dim:
        raise unsupported("stack along a dense dimension of sparse tensors")
    expanded = [COO(np.insert(a.indices, axis, 0, axis=0), a.values,
                    a.shape[:axis] + (1,) + a.shape[axis:], a.coalesced) for a in arrays]
    out = _concatenate(expanded, axis)
    out.coalesced = axis == 0 and all(a.coalesced for a in arrays)
    return out


def _split(a, indices_or_sections, axis=0):
    if not isinstance(a, COO):
        raise unsupported("split")
    axis = axis % a.ndim
    if axis >= a.sparse_dim:
        raise unsupported("split along a dense dimension of a sparse tensor")
    n = a.shape[axis]
    if isinstance(indices_or_sections, numbers.Integral):
        step = n // int(indices_or_sections)
        bounds = list(range(step, n, step))
    else:
        bounds = [int(b) for b in indices_or_sections]
    pieces = []
    for start, stop in zip([0] + bounds, bounds + [n]):
        keep = (a.indices[axis] >= start) & (a.indices[axis] < stop)
        idx = a.indices[:, keep]
        idx[axis] -= start
        shape = list(a.shape)
        shape[axis] = max(stop - start, 0)
        pieces.append(COO(idx, a.values[keep], shape, a.coalesced))
    return pieces


def _squeeze(a, axis=None):
    axes = [i for i, s in enumerate(a.shape) if s == 1] if axis is None else \
        [x % a.ndim for x in ((axis,) if isinstance(axis, numbers.Integral) else axis)]
    for x in axes:
        if a.shape[x] != 1:
            raise ValueError("cannot select an axis to squeeze out which has size not equal to one")
    sparse_axes = [x for x in axes if x < a.sparse_dim]
    dense_axes = tuple(x - a.sparse_dim + 1 for x in axes if x >= a.sparse_dim)
    indices = np.delete(a.indices, sparse_axes, axis=0)
    values = np.squeeze(a.values, dense_axes) if dense_axes else a.values
    shape = [s for i, s in enumerate(a.shape) if i not in axes]
    return COO(indices, values, shape, a.coalesced)


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


def _transpose(a, axes=None):
    return _permute(a, list(range(a.ndim))[::-1] if axes is None else axes)


def _swapaxes(a, axis1, axis2):
    axes = list(range(a.ndim))
    i, j = axis1 % a.ndim, axis2 % a.ndim
    axes[i], axes[j] = axes[j], axes[i]
    return _permute(a, axes)


def _broadcast_to(a, shape, subok=False):
    if tuple(shape) != a.shape:
        raise unsupported("broadcasting a sparse tensor")
    return a


def _sum(a, axis=None, dtype=None, out=None, keepdims=False, **kwargs):
    return a.sum(axis=axis, dtype=dtype, keepdims=keepdims, out=out)


def _ndim(a):
    return a.ndim


def _shape(a):
    return a.shape


_FUNCTIONS = {
    np.concatenate: _concatenate,
    np.stack: _stack,
    np.split: _split,
    np.squeeze: _squeeze,
    np.transpose: _transpose,
    np.swapaxes: _swapaxes,
    np.broadcast_to: _broadcast_to,
    np.sum: _sum,
    np.ndim: _ndim,
    np.shape: _shape,
}


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

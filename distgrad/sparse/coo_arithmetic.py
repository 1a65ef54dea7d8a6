"""Elementwise arithmetic and matmul of :class:`~distgrad.sparse.coo.COO` arrays, with
PyTorch's sparse rules (sparse + sparse is sparse, dense + sparse is dense, sparse *
dense is sparse, sparse @ dense is dense): the NumPy ufuncs a COO answers, installed
into its table."""
import numpy as np

from .coo import _UFUNCS, COO, _linear, _permute, _scalar, _shape_text, unsupported


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


_UFUNCS.update({
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
})

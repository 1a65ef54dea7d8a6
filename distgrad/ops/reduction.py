"""Reductions with ``dim``/``keepdim``: sum, mean, var, std, max, min, amax, amin, prod, logsumexp.

Ties follow PyTorch: a full ``max``/``min`` and ``amax``/``amin`` split the
gradient evenly among equal extrema; ``max(dim)`` sends it to the returned index.
"""
import builtins
from collections import namedtuple

import numpy as np

from ..autograd import dtype as _dt
from ..autograd.tensor import TensorBase
from ..autograd._internal import array_of, defop, record, reduction_axes, wrap, wrap_dim
from . import indexing, shape as _shape
from .arithmetic import pow as _pow
from .indexing import where
from .unary import abs as _abs, sqrt

__all__ = ["sum", "mean", "var", "std", "var_mean", "std_mean", "max", "min", "amax", "amin",
           "prod", "logsumexp", "argmax", "argmin", "all", "any", "norm", "cumsum",
           "count_nonzero", "sum_to_size"]

max_result = namedtuple("max", ["values", "indices"])
min_result = namedtuple("min", ["values", "indices"])


def _dims(dim, ndim):
    """Normalise ``dim`` (None, int, or a sequence) to a sorted tuple of axes."""
    if dim is None:
        return tuple(range(ndim))
    if isinstance(dim, (list, tuple)):
        if len(dim) == 0:
            return tuple(range(ndim))
        dims = tuple(sorted(wrap_dim(d, ndim) for d in dim))
        if len(set(dims)) != len(dims):
            raise RuntimeError(f"dim {dims[0]} appears multiple times in the list of dims")
        return dims if ndim else ()
    return (wrap_dim(dim, ndim),) if ndim else ()


def _kept_shape(shape, dims):
    return tuple(1 if i in dims else s for i, s in enumerate(shape))


def _expand(xp, g, m):
    """A reduced gradient broadcast back to the input's shape."""
    if not m["keepdim"]:
        g = xp.reshape(g, m["kept"])
    return xp.broadcast_to(g, m["shape"])


def _meta(x, dims, keepdim):
    shape = array_of(x).shape
    return {"dim": dims, "keepdim": keepdim, "shape": shape, "kept": _kept_shape(shape, dims),
            "self_sym_sizes": shape}


_sum_vjp = (lambda xp, g, m: _expand(xp, g, m),)
_mean_vjp = (lambda xp, g, m: _expand(xp, g, m) / m["count"],)
# PyTorch numbers the overloads: 0 for a full reduction, 1 for one over `dim`.
SumBackward0 = defop("SumBackward0", vjps=_sum_vjp)
SumBackward1 = defop("SumBackward1", vjps=_sum_vjp)
MeanBackward0 = defop("MeanBackward0", vjps=_mean_vjp)
MeanBackward1 = defop("MeanBackward1", vjps=_mean_vjp)


def sum(input, dim=None, keepdim=False, *, dtype=None):  # noqa: A001
    d = array_of(input)
    dims = _dims(dim, d.ndim)
    np_dtype = _dt.to_numpy_dtype(dtype) if dtype is not None else (
        np.int64 if d.dtype.kind in "biu" else None)
    res = d.sum(axis=dims, keepdims=keepdim, dtype=np_dtype)
    node = SumBackward0 if dim is None else SumBackward1
    return record(node, np.asarray(res), (input,), (), _meta(input, dims, keepdim))


def mean(input, dim=None, keepdim=False, *, dtype=None):
    d = array_of(input)
    if d.dtype.kind in "biu" and dtype is None:
        raise RuntimeError(f"mean(): could not infer output dtype. Input dtype must be either a "
                           f"floating point or complex dtype. Got: {input.dtype!r}")
    dims = _dims(dim, d.ndim)
    res = d.mean(axis=dims, keepdims=keepdim,
                 dtype=_dt.to_numpy_dtype(dtype) if dtype is not None else None)
    m = _meta(input, dims, keepdim)
    count = 1
    for i in dims:
        count *= d.shape[i]
    m["count"] = count
    node = MeanBackward0 if dim is None else MeanBackward1
    return record(node, np.asarray(res, dtype=res.dtype), (input,), (), m)


def _correction(unbiased, correction):
    if correction is not None:
        return correction
    if unbiased is None:
        return 1
    return 1 if unbiased else 0


def _var_vjp(xp, g, m, x):
    centered = x - xp.sum(x, axis=m["dim"], keepdims=True) / m["count"]
    return _expand(xp, g, m) * centered * (2.0 / (m["count"] - m["correction"]))


def _std_vjp(xp, g, m, x, r):
    centered = x - xp.sum(x, axis=m["dim"], keepdims=True) / m["count"]
    with np.errstate(divide="ignore", invalid="ignore"):
        return _expand(xp, g / r, m) * centered * (1.0 / (m["count"] - m["correction"]))


VarBackward0 = defop("VarBackward0", saved=("self",), vjps=(_var_vjp,))
StdBackward0 = defop("StdBackward0", saved=("self", "result"), vjps=(_std_vjp,))


def _var_common(input, dim, unbiased, keepdim, correction):
    d = array_of(input)
    if isinstance(dim, bool):  # var(x, False): the legacy `unbiased` positional
        unbiased, dim = dim, None
    dims = _dims(dim, d.ndim)
    c = _correction(unbiased, correction)
    m = _meta(input, dims, keepdim)
    count = 1
    for i in dims:
        count *= d.shape[i]
    m["count"] = count
    m["correction"] = c
    with np.errstate(divide="ignore", invalid="ignore"):
        centered = d - d.mean(axis=dims, keepdims=True)
        sq = (centered * centered.conj()).real if d.dtype.kind == "c" else centered * centered
        v = sq.sum(axis=dims, keepdims=keepdim) / builtins.max(count - c, 0)
    return d, m, np.asarray(v, dtype=v.dtype)


def var(input, dim=None, unbiased=None, keepdim=False, *, correction=None):
    d, m, v = _var_common(input, dim, unbiased, keepdim, correction)
    return record(VarBackward0, v, (input,), (input,), m)


def std(input, dim=None, unbiased=None, keepdim=False, *, correction=None):
    d, m, v = _var_common(input, dim, unbiased, keepdim, correction)
    return record(StdBackward0, np.sqrt(v), (input,), (input,), m)


def var_mean(input, dim=None, unbiased=None, keepdim=False, *, correction=None):
    return var(input, dim, unbiased, keepdim, correction=correction), mean(input, dim, keepdim)


def std_mean(input, dim=None, unbiased=None, keepdim=False, *, correction=None):
    return std(input, dim, unbiased, keepdim, correction=correction), mean(input, dim, keepdim)


def _evenly_vjp(xp, g, m, x, r):
    """Split the gradient evenly among the elements equal to the extremum (PyTorch's rule)."""
    xr = array_of(x) if isinstance(x, TensorBase) else x
    rr = array_of(r) if isinstance(r, TensorBase) else r
    rk = rr if m["keepdim"] else rr.reshape(m["kept"])
    hit = (xr == rk) | (np.isnan(xr) & np.isnan(rk)) if xr.dtype.kind == "f" else (xr == rk)
    count = hit.sum(axis=m["dim"], keepdims=True)
    return xp.mask(_expand(xp, g, m) / count.astype(xr.dtype), hit)


AmaxBackward0 = defop("AmaxBackward0", saved=("self", "result"), vjps=(_evenly_vjp,))
AminBackward0 = defop("AminBackward0", saved=("self", "result"), vjps=(_evenly_vjp,))
MaxBackward1 = defop("MaxBackward1", saved=("self", "result"), vjps=(_evenly_vjp,))
MinBackward1 = defop("MinBackward1", saved=("self", "result"), vjps=(_evenly_vjp,))


def _select_vjp(xp, g, m, indices):
    idx = array_of(indices) if isinstance(indices, TensorBase) else indices
    dim = m["dim"][0]
    if not m["keepdim"]:
        idx = np.expand_dims(idx, dim)
        g = xp.expand_dims(g, dim)
    return xp.scatter_add_along(m["shape"], idx, g, dim)


MaxBackward0 = defop("MaxBackward0", saved=("indices",), vjps=(_select_vjp,))
MinBackward0 = defop("MinBackward0", saved=("indices",), vjps=(_select_vjp,))


def _extreme(input, dim, keepdim, other, is_max):
    if isinstance(dim, TensorBase) or other is not None:
        other = dim if isinstance(dim, TensorBase) else other
        return indexing.maximum(input, other) if is_max else indexing.minimum(input, other)
    d = array_of(input)
    if d.dtype.kind == "c":
        raise RuntimeError(f"{'max' if is_max else 'min'}(): does not support complex input")
    if dim is None:
        if d.size == 0:
            raise RuntimeError("max(): Expected reduction dim to be specified for input.numel() "
                               "== 0. Specify the reduction dim with the 'dim' argument.")
        res = np.asarray(d.max() if is_max else d.min())
        dims = tuple(range(d.ndim))
        node = MaxBackward1 if is_max else MinBackward1
        return record(node, res, (input,), (input,), _meta(input, dims, False))
    dims = _dims(dim, d.ndim)
    axis = dims[0] if dims else None
    if axis is None:  # 0-dim input
        values = d.copy()
        idx = np.zeros((), dtype=np.int64)
    else:
        idx = (np.argmax if is_max else np.argmin)(d, axis=axis, keepdims=keepdim)
        values = np.take_along_axis(d, idx if keepdim else np.expand_dims(idx, axis), axis=axis)
        if not keepdim:
            values = values.squeeze(axis)
    indices = wrap(np.asarray(idx, dtype=np.int64))
    node = MaxBackward0 if is_max else MinBackward0
    m = _meta(input, dims or (0,), keepdim)
    if not dims:
        m["keepdim"] = True
    out = record(node, np.ascontiguousarray(values), (input,), (indices,), m)
    return (max_result if is_max else min_result)(out, indices)


def max(input, dim=None, keepdim=False, *, other=None):  # noqa: A001
    return _extreme(input, dim, keepdim, other, True)


def min(input, dim=None, keepdim=False, *, other=None):  # noqa: A001
    return _extreme(input, dim, keepdim, other, False)


def amax(input, dim=(), keepdim=False):
    d = array_of(input)
    dims = _dims(dim, d.ndim)
    res = np.asarray(d.max(axis=dims, keepdims=keepdim))
    return record(AmaxBackward0, res, (input,), (input,), _meta(input, dims, keepdim))


def amin(input, dim=(), keepdim=False):
    d = array_of(input)
    dims = _dims(dim, d.ndim)
    res = np.asarray(d.min(axis=dims, keepdims=keepdim))
    return record(AminBackward0, res, (input,), (input,), _meta(input, dims, keepdim))


def _prod_vjp(xp, g, m, x, r):
    xr = array_of(x) if isinstance(x, TensorBase) else x
    ge = _expand(xp, g, m)
    if not (xr == 0).any():
        rk = r if m["keepdim"] else xp.reshape(r, m["kept"])
        return ge * xp.conj(rk / x)
    if xp.is_tensor_backend():
        return ge * xp.conj(_prod_of_others(x, m["dim"]))
    # With zeros, the product of all the other elements, from exclusive cumulative products.
    dims = m["dim"]
    flat = np.moveaxis(xr, dims, range(xr.ndim - len(dims), xr.ndim))
    lead = flat.shape[:xr.ndim - len(dims)]
    flat = flat.reshape(lead + (-1,))
    one = np.ones(lead + (1,), dtype=xr.dtype)
    left = np.cumprod(np.concatenate([one, flat[..., :-1]], axis=-1), axis=-1)
    right = np.cumprod(np.concatenate([one, flat[..., ::-1][..., :-1]], axis=-1), axis=-1)[..., ::-1]
    others = (left * right).reshape(lead + tuple(xr.shape[i] for i in dims))
    others = np.moveaxis(others, range(xr.ndim - len(dims), xr.ndim), dims)
    return ge * np.conj(others)


def _prod_of_others(x, dims):
    """For each element, the product of the others over ``dims``, differentiably.

    Used under ``create_graph=True`` when zeros forbid ``result / x``: every element
    is replaced by 1 in its own row of an (n, n) expansion, then rows are multiplied
    (O(n^2) memory over the reduced size, fine for the second-order path).
    """
    d = array_of(x)
    moved = _shape.movedim(x, list(dims), list(range(d.ndim - len(dims), d.ndim)))
    lead = array_of(moved).shape[:d.ndim - len(dims)]
    reduced = array_of(moved).shape[d.ndim - len(dims):]
    n = int(np.prod(reduced)) if reduced else 1
    flat = _shape.reshape(moved, lead + (n,))
    rows = _shape.expand(_shape.unsqueeze(flat, -2), lead + (n, n))
    eye = wrap(np.broadcast_to(np.eye(n, dtype=bool), lead + (n, n)))
    others = prod(where(eye, wrap(np.ones((), dtype=d.dtype)), rows), -1)
    others = _shape.reshape(others, lead + reduced)
    return _shape.movedim(others, list(range(d.ndim - len(dims), d.ndim)), list(dims))


ProdBackward0 = defop("ProdBackward0", saved=("self", "result"), vjps=(_prod_vjp,))
ProdBackward1 = defop("ProdBackward1", saved=("self", "result"), vjps=(_prod_vjp,))


def prod(input, dim=None, keepdim=False, *, dtype=None):
    d = array_of(input)
    dims = _dims(dim, d.ndim)
    np_dtype = _dt.to_numpy_dtype(dtype) if dtype is not None else (
        np.int64 if d.dtype.kind in "biu" else None)
    res = np.asarray(d.prod(axis=dims, keepdims=keepdim, dtype=np_dtype))
    node = ProdBackward0 if dim is None else ProdBackward1
    return record(node, res, (input,), (input,), _meta(input, dims, keepdim))


def _logsumexp_vjp(xp, g, m, x, r):
    rk = r if m["keepdim"] else xp.reshape(r, m["kept"])
    return _expand(xp, g, m) * xp.exp(x - rk)


LogsumexpBackward0 = defop("LogsumexpBackward0", saved=("self", "result"), vjps=(_logsumexp_vjp,))


def logsumexp(input, dim, keepdim=False):
    d = array_of(input)
    if d.dtype.kind in "biu":
        d = d.astype(_dt.get_default_dtype().numpy)
    dims = _dims(dim, d.ndim)
    mx = d.max(axis=dims, keepdims=True) if d.size else np.zeros(_kept_shape(d.shape, dims), d.dtype)
    mx = np.where(np.isfinite(mx), mx, 0)
    with np.errstate(divide="ignore"):
        res = np.log(np.exp(d - mx).sum(axis=dims, keepdims=True)) + mx
    if not keepdim:
        res = res.reshape(tuple(s for i, s in enumerate(d.shape) if i not in dims))
    return record(LogsumexpBackward0, res, (input,), (input,), _meta(input, dims, keepdim))


def argmax(input, dim=None, keepdim=False):
    d = array_of(input)
    if dim is None:
        return wrap(np.asarray(np.argmax(d), dtype=np.int64))
    return wrap(np.asarray(np.argmax(d, axis=wrap_dim(dim, d.ndim), keepdims=keepdim), np.int64))


def argmin(input, dim=None, keepdim=False):
    d = array_of(input)
    if dim is None:
        return wrap(np.asarray(np.argmin(d), dtype=np.int64))
    return wrap(np.asarray(np.argmin(d, axis=wrap_dim(dim, d.ndim), keepdims=keepdim), np.int64))


def all(input, dim=None, keepdim=False):  # noqa: A001
    d = array_of(input)
    return wrap(np.asarray(d.all(axis=None if dim is None else _dims(dim, d.ndim), keepdims=keepdim)))


def any(input, dim=None, keepdim=False):  # noqa: A001
    d = array_of(input)
    return wrap(np.asarray(d.any(axis=None if dim is None else _dims(dim, d.ndim), keepdims=keepdim)))


def count_nonzero(input, dim=None):
    d = array_of(input)
    return wrap(np.asarray(np.count_nonzero(d, axis=None if dim is None else _dims(dim, d.ndim)),
                            dtype=np.int64))


def norm(input, p="fro", dim=None, keepdim=False):
    """Vector p-norms (and Frobenius), composed from primitives."""
    if p in ("fro", 2, 2.0):
        x = input
        sq = x * x.conj() if x.is_complex() else x * x
        return sqrt(sum(sq.real if x.is_complex() else sq, dim, keepdim))
    if p in (float("inf"), "inf"):
        return amax(_abs(input), dim if dim is not None else (), keepdim)
    if p == 1:
        return sum(_abs(input), dim, keepdim)
    return _pow(sum(_pow(_abs(input), p), dim, keepdim), 1.0 / p)


CumsumBackward0 = defop("CumsumBackward0", vjps=(
    lambda xp, g, m: xp.flip_cumsum(g, m["dim"]),))


def cumsum(input, dim, *, dtype=None):
    d = array_of(input)
    axis = wrap_dim(dim, d.ndim)
    res = np.cumsum(d, axis=axis, dtype=_dt.to_numpy_dtype(dtype) if dtype is not None else (
        np.int64 if d.dtype.kind in "biu" else None))
    return record(CumsumBackward0, res, (input,), (), {"dim": axis})


def sum_to_size(input, *size):
    """Sum a broadcast tensor down to ``size`` (the inverse of ``expand``)."""
    size = _shape._shape_arg(size)
    d = array_of(input)
    axes = reduction_axes(d.shape, size)
    if axes is None:
        raise RuntimeError(f"size {list(size)} is not expandable to size {list(d.shape)}")
    if not axes:
        return input
    return _shape.reshape(sum(input, axes, keepdim=True), size)

"""Writing into a copy of a tensor at given indices: ``scatter``, ``scatter_add``,
``index_add``, ``index_fill``, ``index_copy`` (the in-place ``*_`` forms are these plus
the write of ``ops/inplace.py``).

Two ways of naming positions: ``scatter*`` take an index tensor shaped like the source
(``out[..., index[i, j], ...] = src[i, j]`` along ``dim``), ``index_*`` take a vector of
positions along ``dim`` and a source whole slices at a time. The gradients:
positions that were overwritten get none from the output; a source gets the output's
gradient gathered back from where it went.
"""
import warnings

import numpy as np

from ..autograd.tensor import TensorBase
from .fused import scalar_type_name as _type_name
from ..autograd._internal import array_of, wrap_dim, defop, record

__all__ = ["scatter", "scatter_add", "index_add", "index_fill", "index_copy"]


def _index_array(index, message, error=RuntimeError):
    """``index`` as an integer ndarray; ``message`` (with ``{dtype}``) is the error otherwise."""
    idx = array_of(index) if isinstance(index, TensorBase) else np.asarray(index)
    if idx.dtype.kind not in "iu":
        raise error(message.format(dtype=_type_name(idx.dtype)))
    return idx


def _check_bounds(idx, size, dim, error=RuntimeError, prefix="", allow_negative=False):
    if idx.size == 0:
        return idx
    low = -size if allow_negative else 0
    bad = idx[(idx < low) | (idx >= size)]
    if bad.size:
        raise error(f"{prefix}index {int(bad.flat[0])} is out of bounds for dimension {dim} with "
                    f"size {size}")
    return idx % size if allow_negative else idx


def _check_same_dtype(op, self_dtype, src_dtype):
    if self_dtype != src_dtype:
        raise RuntimeError(f"{op}(): Expected self.dtype to be equal to src.dtype")


# -- scatter, scatter_add: an index tensor shaped like the source --

def _scatter_positions(shape, idx, dim, src_shape):
    """The positions of ``out`` that ``index`` names, as a tuple of broadcast index arrays."""
    if idx.ndim != len(shape):
        raise RuntimeError("Index tensor must have the same number of dimensions as self tensor")
    if src_shape is not None and len(src_shape) != idx.ndim:
        raise RuntimeError("Index tensor must have the same number of dimensions as src tensor")
    for i, n in enumerate(idx.shape):
        if (i != dim and n > shape[i]) or (src_shape is not None and n > src_shape[i]):
            src = f" and to be no larger size than src {list(src_shape)}" if src_shape else ""
            raise RuntimeError(f"Expected index {list(idx.shape)} to be no larger than self "
                               f"{list(shape)} apart from dimension {dim}{src}")
    _check_bounds(idx, shape[dim], dim)
    grid = list(np.ogrid[tuple(slice(0, n) for n in idx.shape)])
    grid[dim] = idx
    return tuple(grid)


def _extent(idx, all_but=None):
    """The leading block of a source that an index tensor covers (of an output, ``all_but``
    its dimension ``dim``, which the index values address)."""
    return tuple(slice(None) if i == all_but else slice(0, n) for i, n in enumerate(idx.shape))


def _overwritten_mask(shape, positions):
    keep = np.ones(shape, dtype=bool)
    keep[positions] = False
    return keep


def _src_grad(xp, g, m):
    """The gradient of ``src``: ``g`` gathered along ``dim``, zero outside the index's extent."""
    idx = m["index"]
    piece = xp.take_along_axis(xp.take(g, _extent(idx, all_but=m["dim"])), idx, m["dim"])
    if tuple(idx.shape) == tuple(m["src_shape"]):
        return piece
    return xp.index_add(m["src_shape"], _extent(idx), piece, False)


def _not_differentiable(op):
    def vjp(xp, g, m):
        raise RuntimeError(f"derivative for aten::{op} is not implemented")
    return vjp


ScatterBackward0 = defop("ScatterBackward0", vjps=(lambda xp, g, m: xp.mask(g, m["keep"]),
                                                   _src_grad))
ScatterBackward1 = defop("ScatterBackward1", vjps=(lambda xp, g, m: xp.mask(g, m["keep"]),))
ScatterReduceBackward = defop("ScatterBackward0", vjps=(_not_differentiable("scatter"),) * 2)
ScatterAddBackward0 = defop("ScatterAddBackward0", vjps=(lambda xp, g, m: g, _src_grad))

_REDUCE_UFUNCS = {"add": np.add, "multiply": np.multiply}


def scatter(input, dim, index, src=None, *, value=None, reduce=None):
    """``out = input.clone(); out[..., index[i], ...] = src[i]`` along ``dim`` (or ``value``).

    >>> import distgrad
    >>> distgrad.zeros(2, 3).scatter(1, distgrad.tensor([[2], [0]]), 1.0).tolist()
    [[0.0, 0.0, 1.0], [1.0, 0.0, 0.0]]
    """
    if src is not None and not isinstance(src, TensorBase):
        src, value = None, src
    if src is None and value is None:
        raise TypeError("scatter() missing 1 required positional argument: 'src' or 'value'")
    d = array_of(input)
    dim = wrap_dim(dim, d.ndim)
    idx = _index_array(index, "scatter(): Expected dtype int32/int64 for index")
    if reduce is not None and reduce not in _REDUCE_UFUNCS:
        raise RuntimeError("reduce argument must be either add or multiply.")
    if src is not None:
        _check_same_dtype("scatter", d.dtype, array_of(src).dtype)
        positions = _scatter_positions(d.shape, idx, dim, array_of(src).shape)
        values = array_of(src)[_extent(idx)]
    else:
        positions = _scatter_positions(d.shape, idx, dim, None)
        values = np.asarray(value, dtype=d.dtype)
    out = d.copy()
    if reduce is None:
        out[positions] = values
    else:
        if src is not None:
            warnings.warn("The reduce argument of torch.scatter with Tensor src is deprecated and "
                          "will be removed in a future PyTorch release. Use torch.scatter_reduce "
                          "instead for more reduction options.", UserWarning, stacklevel=2)
        _REDUCE_UFUNCS[reduce].at(out, positions, np.broadcast_to(values, idx.shape))
        inputs = (input, src) if src is not None else (input,)
        return record(ScatterReduceBackward, out, inputs)
    keep = _overwritten_mask(d.shape, positions)
    if src is None:
        return record(ScatterBackward1, out, (input,), (), {"keep": keep})
    return record(ScatterBackward0, out, (input, src), (),
                  {"keep": keep, "index": idx, "dim": dim, "src_shape": array_of(src).shape},
                  kept=(index,))


def scatter_add(input, dim, index, src):
    """``out[..., index[i], ...] += src[i]`` along ``dim``; repeated indices accumulate."""
    if not isinstance(src, TensorBase):
        raise TypeError(f"scatter_add(): argument 'src' (position 3) must be Tensor, not "
                        f"{type(src).__name__}")
    d = array_of(input)
    dim = wrap_dim(dim, d.ndim)
    idx = _index_array(index, "scatter(): Expected dtype int32/int64 for index")
    _check_same_dtype("scatter", d.dtype, array_of(src).dtype)
    positions = _scatter_positions(d.shape, idx, dim, array_of(src).shape)
    out = d.copy()
    np.add.at(out, positions, array_of(src)[_extent(idx)])
    return record(ScatterAddBackward0, out, (input, src), (),
                  {"index": idx, "dim": dim, "src_shape": array_of(src).shape}, kept=(index,))


# -- index_add, index_fill, index_copy: a vector of positions along dim --

def _slice_key(ndim, dim, idx):
    return (slice(None),) * dim + (idx,) + (slice(None),) * (ndim - dim - 1)


def _check_index_vector(idx, op, error=IndexError):
    if idx.ndim > 1:
        raise error(f"{op}(): Index is supposed to be a vector, but got dim: {idx.ndim} with "
                    f"type: {_type_name(idx.dtype)} and size: {list(idx.shape)}")
    return idx.reshape(-1)


def _check_source_shape(d, s, dim, count, op):
    if s.ndim and s.shape[dim] != count:
        raise RuntimeError(f"{op}(): Number of indices ({count}) should be equal to "
                           f"source.size(dim): ({s.shape[dim]}), for dim: {dim}")
    if s.ndim and (s.ndim != d.ndim or any(a != b for i, (a, b) in enumerate(zip(d.shape, s.shape))
                                           if i != dim)):
        raise RuntimeError("source tensor shape must match self tensor shape, excluding the "
                           f"specified dimension. Got self.shape = {list(d.shape)} source.shape "
                           f"= {list(s.shape)}")


def _scaled(g, alpha):
    return g if alpha == 1 else g * alpha


IndexAddBackward0 = defop("IndexAddBackward0", vjps=(
    lambda xp, g, m: g,
    lambda xp, g, m: _scaled(xp.reshape(xp.take(g, m["key"]), m["source_shape"]), m["alpha"])))


def index_add(input, dim, index, source, *, alpha=1):
    """``out.select(dim, index[i]) += alpha * source.select(dim, i)``; repeats accumulate.

    >>> import distgrad
    >>> distgrad.zeros(3).index_add(0, distgrad.tensor([0, 0, 2]), distgrad.ones(3)).tolist()
    [2.0, 0.0, 1.0]
    """
    d, s = array_of(input), array_of(source)
    dim = wrap_dim(dim, d.ndim)
    idx = _index_array(index, "index_add_(): Expected dtype int32/int64 for index but got: "
                             "{dtype}")
    idx = _check_index_vector(idx, "index_add_")
    _check_source_shape(d, s, dim, idx.size, "index_add_")
    if d.dtype != s.dtype:
        raise RuntimeError(f"index_add_(): self ({_type_name(d.dtype)}) and source "
                           f"({_type_name(s.dtype)}) must have the same scalar type")
    _check_bounds(idx, d.shape[dim] if d.ndim else 1, dim)
    key = _slice_key(d.ndim, dim, idx)
    out = d.copy()
    np.add.at(out, key, _scaled(s, alpha).reshape(out[key].shape))
    return record(IndexAddBackward0, out, (input, source), (),
                  {"key": key, "alpha": alpha, "source_shape": s.shape}, kept=(index,))


def _filled_positions(d, dim, index, op, allow_negative):
    """The index vector (checked) and the mask of the slices it names."""
    if op == "index_fill_":
        idx = _index_array(index, "index_fill_(): Expected dtype int64 for index.", IndexError)
    else:
        idx = _index_array(index, op + "(): Expected a long tensor for index, but got {dtype}")
    if idx.ndim > 1:
        raise RuntimeError("Index has to be a vector/scalar")
    idx = _check_bounds(idx.reshape(-1), d.shape[dim] if d.ndim else 1, dim, IndexError,
                        "" if allow_negative else f"{op}(): ", allow_negative)
    key = _slice_key(d.ndim, dim, idx)
    return key, _overwritten_mask(d.shape, key)


IndexFillBackward0 = defop("IndexFillBackward0", vjps=(lambda xp, g, m: xp.mask(g, m["keep"]),))
IndexFillBackward1 = defop("IndexFillBackward1", vjps=(
    lambda xp, g, m: xp.mask(g, m["keep"]),
    lambda xp, g, m: xp.sum(xp.mask(g, ~m["keep"]))))


def index_fill(input, dim, index, value):
    """``value`` in every slice ``index`` names along ``dim`` (negative indices count back)."""
    d = array_of(input)
    dim = wrap_dim(dim, d.ndim)
    key, keep = _filled_positions(d, dim, index, "index_fill_", allow_negative=True)
    out = d.copy()
    if isinstance(value, TensorBase):
        if array_of(value).ndim != 0:
            raise RuntimeError(f"index_fill_ only supports a 0-dimensional value tensor, but got "
                               f"tensor with {array_of(value).ndim} dimension(s).")
        out[key] = array_of(value)
        return record(IndexFillBackward1, out, (input, value), (), {"keep": keep})
    out[key] = value
    return record(IndexFillBackward0, out, (input,), (), {"keep": keep})


IndexCopyBackward0 = defop("IndexCopyBackward0", vjps=(
    lambda xp, g, m: xp.mask(g, m["keep"]),
    lambda xp, g, m: xp.reshape(xp.take(g, m["key"]), m["source_shape"])))


def index_copy(input, dim, index, source):
    """``out.select(dim, index[i]) = source.select(dim, i)``."""
    d, s = array_of(input), array_of(source)
    dim = wrap_dim(dim, d.ndim)
    key, keep = _filled_positions(d, dim, index, "index_copy_", allow_negative=False)
    count = key[dim].size
    if s.ndim and s.shape[dim] != count:
        raise IndexError(f"index_copy_(): Number of indices ({count}) should be equal to "
                         f"source.size(dim) ({s.shape[dim]})")
    if d.dtype != s.dtype:
        raise RuntimeError(f"index_copy_(): self and source expected to have the same dtype, but "
                           f"got (self) {_type_name(d.dtype)} and (source) {_type_name(s.dtype)}")
    out = d.copy()
    try:
        out[key] = s.reshape(out[key].shape)
    except ValueError:
        raise RuntimeError(f"index_copy_(): Source/destination tensor must have same slice "
                           f"shapes. Got self.shape = {list(d.shape)} source.shape = "
                           f"{list(s.shape)}") from None
    return record(IndexCopyBackward0, out, (input, source), (),
                  {"keep": keep, "key": key, "source_shape": s.shape}, kept=(index,))

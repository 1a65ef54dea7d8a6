"""The NumPy array functions a :class:`~distgrad.sparse.coo.COO` answers (NEP 18):
concatenate, stack, split, squeeze, transpose, broadcast_to, sum..., installed into
its table."""
import numbers

import numpy as np

from .coo import _FUNCTIONS, COO, _permute, unsupported


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


_FUNCTIONS.update({
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
})

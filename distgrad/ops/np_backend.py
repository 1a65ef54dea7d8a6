"""The array namespace VJP rules see in an ordinary backward: NumPy, with PyTorch's argument names.

``tensor_backend`` exposes the same functions over differentiable tensor ops, for
``create_graph=True``. Keep the two in step: a rule may use only what both define.
"""
import numpy as np

from .erf import erf as erf_array


exp = np.exp
log = np.log
sin = np.sin
cos = np.cos
sqrt = np.sqrt
where = np.where
matmul = np.matmul
real = np.real
sign = np.sign
tanh = np.tanh


def conj(a):
    # np.conj copies a real array; a real array is its own conjugate.
    return a.conj() if a.dtype.kind == "c" else a


def tanh_backward(g, r):
    """``g * conj(1 - r*r)`` with one full-size temporary instead of three: the largest
    layers' backward is where an activation-offloading step peaks."""
    if g.shape != r.shape or g.dtype != r.dtype:
        return g * conj(1 - r * r)
    out = np.multiply(r, r)
    np.subtract(1, out, out=out)
    if out.dtype.kind == "c":
        np.conjugate(out, out=out)
    np.multiply(g, out, out=out)
    return out


def sgn(a):
    """x/|x| for complex, sign for real (PyTorch's ``sgn``)."""
    if a.dtype.kind != "c":
        return np.sign(a)
    mag = np.abs(a)
    zero = mag == 0
    return np.where(zero, 0, a / np.where(zero, 1, mag)).astype(a.dtype, copy=False)


_add_reduce = np.add.reduce


def sum(a, axis=None, keepdims=False):  # noqa: A001
    # np.add.reduce directly: ndarray.sum goes through a Python-level wrapper first.
    return _add_reduce(a, axis=axis, keepdims=keepdims)


def reshape(a, shape):
    return a.reshape(shape)


def broadcast_to(a, shape):
    """``np.broadcast_to``: a read-only view with zero strides. Built directly for a
    contiguous array (np.broadcast_to takes ~7 us through an nditer; a sum's or mean's
    VJP on a small graph pays that on every step)."""
    if type(a) is not np.ndarray:
        a = np.asarray(a)
    pad = len(shape) - a.ndim
    if pad < 0 or not a.flags.c_contiguous:
        return np.broadcast_to(a, shape)
    strides = [0] * pad
    for n, have, stride in zip(shape[pad:], a.shape, a.strides):
        if have == n:
            strides.append(stride)
        elif have == 1:
            strides.append(0)
        else:
            return np.broadcast_to(a, shape)  # its error names the shapes
    out = np.ndarray(shape, a.dtype, buffer=a, strides=strides)
    out.flags.writeable = False
    return out


def expand_dims(a, axis):
    return np.expand_dims(a, axis)


def swapaxes(a, i, j):
    if a.ndim == 2:
        return a.T  # np.swapaxes is a Python-level wrapper; .T is not
    return np.swapaxes(a, i, j)


def transpose(a, axes):
    return np.transpose(a, axes)


def zeros(shape, like):
    return np.zeros(shape, dtype=like.dtype)



def index_add(base_shape, key, g, accumulate):
    """Zeros of ``base_shape`` with ``g`` put at ``key``; repeated indices accumulate."""
    out = np.zeros(base_shape, dtype=g.dtype)
    rows = _row_index(key, base_shape)
    if rows is not None and accumulate:
        _add_rows(out, rows, g.reshape((rows.size,) + tuple(base_shape[1:])))
        return out
    if not accumulate:
        out[key] = g
        return out
    # Flat positions make np.add.at work for any key (None, Ellipsis, masks, mixes).
    positions = np.arange(out.size).reshape(base_shape)[key]
    np.add.at(out.reshape(-1), positions, g)
    return out


def _row_index(key, base_shape):
    """``key`` as a flat array of rows of the first axis, when it is one integer array
    (an embedding's or ``x[idx]``'s index); None for any other key."""
    if type(key) is tuple and len(key) == 1:
        key = key[0]
    if type(key) is not np.ndarray or key.dtype.kind not in "iu" or not base_shape:
        return None
    rows = key.reshape(-1)
    if rows.size and rows.min() < 0:
        rows = np.where(rows < 0, rows + base_shape[0], rows)
    return rows


def _add_rows(out, rows, g):
    """``out[rows] += g`` with repeated rows summed: sorted, then one ``np.add.reduceat``
    per run of equal rows (np.add.at goes element by element: 6x slower for an
    embedding's backward)."""
    if not rows.size:
        return
    order = np.argsort(rows, kind="stable")
    rows = rows[order]
    starts = np.flatnonzero(np.concatenate(([True], rows[1:] != rows[:-1])))
    out[rows[starts]] = np.add.reduceat(g[order], starts, axis=0)


def index_put_zero(g, key):
    """``g`` with the entries at ``key`` set to zero."""
    out = g.copy()
    out[key] = 0
    return out


def take(a, key):
    return a[key]


def concatenate(arrays, axis):
    return np.concatenate(arrays, axis=axis)


def split_at(a, sections, axis):
    return np.split(a, sections, axis=axis)


def take_along_axis(a, idx, axis):
    return np.take_along_axis(a, idx, axis=axis)


def scatter_add_along(shape, idx, g, axis):
    out = np.zeros(shape, dtype=g.dtype)
    grid = list(np.ogrid[tuple(slice(0, s) for s in idx.shape)])
    grid[axis] = idx
    np.add.at(out, tuple(grid), g)
    return out



def mask(a, cond):
    """``a`` where ``cond`` else 0 (``cond`` is a constant boolean array)."""
    bits = _SAME_SIZE_UINT.get(a.dtype.itemsize) if type(a) is np.ndarray else None
    if bits is None or cond.shape != a.shape or a.dtype.kind not in "fc":
        return np.where(cond, a, 0).astype(a.dtype, copy=False)
    # A bitwise AND with all-ones or all-zeros words: np.where branches per element and
    # costs ten times as much on a random mask (relu's backward); a product would turn
    # an inf gradient at a masked place into nan instead of 0.
    keep = cond.astype(bits)
    np.negative(keep, out=keep)
    np.bitwise_and(a.view(bits), keep, out=keep)
    return keep.view(a.dtype)


_SAME_SIZE_UINT = {2: np.uint16, 4: np.uint32, 8: np.uint64}



def is_tensor_backend():
    return False


def squeeze(a, axis):
    return np.squeeze(a, axis)


def flip(a, dims):
    return np.flip(a, dims)


def flip_cumsum(g, axis):
    """Reverse cumulative sum: the VJP of cumsum."""
    return np.flip(np.cumsum(np.flip(g, axis), axis=axis), axis)


def erf(a):
    # NumPy has no erf: ops/erf.py evaluates fdlibm's on whole arrays.
    return erf_array(a)


def einsum(equation, *operands):
    return np.einsum(equation, *operands, optimize=True)

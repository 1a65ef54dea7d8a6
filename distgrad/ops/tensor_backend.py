"""The array namespace VJP rules see under ``create_graph=True``: differentiable tensor ops.

Mirrors ``np_backend`` function for function, so the same rule records a graph
of its own and higher-order gradients follow.
"""
import numpy as np

from ..autograd.tensor import TensorBase
from . import arithmetic, complex as _complex, indexing, linalg, reduction, shape, unary
from . import einsum as _einsum, np_backend
from ..autograd._internal import array_of, wrap, defop, record

exp = unary.exp
log = unary.log
sin = unary.sin
cos = unary.cos
sqrt = unary.sqrt
tanh = unary.tanh
erf = unary.erf
sign = unary.sign
matmul = linalg.matmul
real = _complex.real
conj = _complex.conj


def _t(x):
    return x if isinstance(x, TensorBase) else wrap(np.asarray(x))


def tanh_backward(g, r):
    return g * conj(1 - r * r)


def sgn(a):
    if array_of(a).dtype.kind != "c":
        return unary.sign(a)
    nonzero = array_of(a) != 0
    mag = unary.abs(a)  # differentiable, so second order through |z| is right
    if not nonzero.all():
        mag = indexing.where(wrap(nonzero), mag, 1.0)
    return mask(a / mag, nonzero)


def where(cond, a, b):
    return indexing.where(_t(cond), a, b)


def sum(a, axis=None, keepdims=False):  # noqa: A001
    return reduction.sum(a, axis, keepdims)


def reshape(a, shape_):
    return shape.reshape(a, shape_)


def broadcast_to(a, shape_):
    return shape.expand(a, shape_)


def expand_dims(a, axis):
    return shape.unsqueeze(a, axis)


def squeeze(a, axis):
    return shape.squeeze(a, axis)


def swapaxes(a, i, j):
    return shape.transpose(a, i, j)


def transpose(a, axes):
    return shape.permute(a, *axes)


def flip(a, dims):
    return shape.flip(a, dims)


def zeros(shape_, like):
    return wrap(np.zeros(shape_, dtype=array_of(like).dtype))



def mask(a, cond):
    cond = np.asarray(cond)
    return indexing.where(wrap(np.broadcast_to(cond, np.broadcast_shapes(cond.shape, array_of(a).shape))),
                          a, 0)


def take(a, key):
    return indexing.getitem(a, key)


IndexAddBackward = defop("IndexAddToZerosBackward0", vjps=(
    lambda xp, g, m: xp.take(g, m["key"]),))
ScatterAlongBackward = defop("ScatterAddAlongBackward0", vjps=(
    lambda xp, g, m: xp.take_along_axis(g, m["index"], m["dim"]),))


def index_add(base_shape, key, g, accumulate):
    out = np_backend.index_add(base_shape, key, array_of(g), accumulate)
    return record(IndexAddBackward, out, (g,), (), {"key": key})


def index_put_zero(g, key):
    keep = np.ones(array_of(g).shape, dtype=bool)
    keep[key] = False
    return mask(g, keep)


def take_along_axis(a, idx, axis):
    return indexing.gather(a, axis, wrap(idx))


def scatter_add_along(shape_, idx, g, axis):
    out = np_backend.scatter_add_along(shape_, idx, array_of(g), axis)
    return record(ScatterAlongBackward, out, (g,), (), {"index": idx, "dim": axis})


def concatenate(arrays, axis):
    return shape.cat(list(arrays), axis)


def split_at(a, offsets, axis):
    n = array_of(a).shape[axis]
    bounds = [0] + [int(o) for o in offsets] + [n]
    return shape.split(a, [bounds[i + 1] - bounds[i] for i in range(len(bounds) - 1)], axis)



def flip_cumsum(g, axis):
    return shape.flip(reduction.cumsum(shape.flip(g, axis), axis), axis)


def einsum(equation, *operands):
    return _einsum.einsum(equation, *operands)


def is_tensor_backend():
    return True

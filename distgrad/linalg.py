"""``torch.linalg``: matrix chains and norms, with gradients.

``multi_dot`` multiplies a chain of matrices in the cheapest order (PyTorch's
matrix-chain dynamic programme, so results round as PyTorch's do) out of ``mm``
nodes; ``vector_norm`` is one node, ``LinalgVectorNormBackward0`` as in PyTorch,
whose rule is written with the backend's array functions, so gradients of
gradients work too. ``matrix_norm`` and ``norm`` are built on them. Norms that need
a singular value decomposition (``ord=2``, ``-2``, ``"nuc"``) raise.

>>> import distgrad
>>> a, b, c = distgrad.ones(2, 3), distgrad.ones(3, 4), distgrad.ones(4)
>>> distgrad.linalg.multi_dot([a, b, c])
tensor([12., 12.])
>>> distgrad.linalg.vector_norm(distgrad.tensor([3.0, 4.0]))
tensor(5.)
"""
import math

import numpy as np

from .autograd._internal import TensorBase, defop, record
from .ops.linalg import mm
from .ops.reduction import amax, amin

__all__ = ["multi_dot", "vector_norm", "matrix_norm", "norm"]

_INF = math.inf


def _dims(dim, ndim):
    if dim is None:
        return tuple(range(ndim))
    dims = (dim,) if isinstance(dim, int) else tuple(dim)
    n = max(ndim, 1)
    out = []
    for d in dims:
        if not -n <= d < n:
            raise IndexError(f"Dimension out of range (expected to be in range of [{-n}, "
                             f"{n - 1}], but got {d})")
        out.append(d % n)
    if len(set(out)) != len(out):
        raise RuntimeError(f"dim {out} appears multiple times in the list of dims")
    return tuple(out)


def _dtype_name(t):
    return t.dtype.numpy.name if hasattr(t.dtype, "numpy") else str(t.dtype)


# ---------------------------------------------------------------------- multi_dot
def _chain_order(dims):
    """PyTorch's matrix-chain order: ``split[i][j]`` is where the product of matrices
    i..j splits (the first cheapest split, as its ``<`` keeps the first)."""
    n = len(dims) - 1
    cost = [[0] * n for _ in range(n)]
    split = [[0] * n for _ in range(n)]
    for length in range(1, n):
        for i in range(n - length):
            j = i + length
            cost[i][j] = None
            for k in range(i, j):
                q = cost[i][k] + cost[k + 1][j] + dims[i] * dims[k + 1] * dims[j + 1]
                if cost[i][j] is None or q < cost[i][j]:
                    cost[i][j], split[i][j] = q, k
    return split


def _chain(mats, split, i, j):
    if i == j:
        return mats[i]
    k = split[i][j]
    return mm(_chain(mats, split, i, k), _chain(mats, split, k + 1, j))


def multi_dot(tensors, *, out=None):
    """The product of a chain of matrices (the first may be a row vector, the last a
    column vector), as ``torch.linalg.multi_dot``."""
    if out is not None:
        raise RuntimeError("multi_dot(): out= is not supported by distgrad")
    tensors = list(tensors)
    n = len(tensors)
    if n < 2:
        raise RuntimeError(f"multi_dot(): expected at least 2 tensors but got {n}")
    first, last = tensors[0], tensors[-1]
    out_shape = []
    mats = list(tensors)
    if first.dim() == 1:
        mats[0] = first.unsqueeze(0)
    elif first.dim() == 2:
        out_shape.append(first.shape[0])
    else:
        raise RuntimeError(f"multi_dot(): the first tensor must be 1D or 2D but got "
                           f"{first.dim()}D")
    if last.dim() == 1:
        mats[-1] = last.unsqueeze(-1)
    elif last.dim() == 2:
        out_shape.append(last.shape[1])
    else:
        raise RuntimeError(f"multi_dot(): the last tensor must be 1D or 2D but got "
                           f"{last.dim()}D")
    for i in range(1, n - 1):
        if tensors[i].dim() != 2:
            raise RuntimeError(f"multi_dot(): tensor {i} must be 2D but got {tensors[i].dim()}D")
    for i in range(1, n):
        if mats[i].dtype != mats[0].dtype:
            raise RuntimeError(f"multi_dot(): all tensors must have be the same dtype but tensor "
                               f"0 is {_dtype_name(mats[0])} and tensor {i} "
                               f"{_dtype_name(mats[i])}")
        if mats[i - 1].shape[-1] != mats[i].shape[0]:
            raise RuntimeError(f"multi_dot(): tensors {i - 1} and {i} with shapes "
                               f"{list(tensors[i - 1].shape)} and {list(tensors[i].shape)} "
                               "cannot be multiplied")
    if n == 2:
        result = mm(mats[0], mats[1])
    elif n == 3:
        a, b = mats[0].shape[0], mats[1].shape[0]
        c, d = mats[2].shape[0], mats[2].shape[1]
        if a * c * (b + d) > b * d * (a + c):
            result = mm(mats[0], mm(mats[1], mats[2]))
        else:
            result = mm(mm(mats[0], mats[1]), mats[2])
    else:
        dims = [mats[0].shape[0]] + [m.shape[1] for m in mats]
        result = _chain(mats, _chain_order(dims), 0, n - 1)
    return result.view(out_shape)


# ---------------------------------------------------------------------- vector_norm
def _norm_vjp(xp, g, m, x, r):
    """PyTorch's ``linalg_vector_norm_backward``."""
    ord_, dims, keepdim = m["ord"], m["dims"], m["keepdim"]
    if not keepdim and x.ndim:
        for d in sorted(dims):
            g = xp.expand_dims(g, d)
            r = xp.expand_dims(r, d)
    if ord_ == 0:
        return g * 0 * xp.sgn(x)
    if ord_ == 2:
        return xp.where(r == 0, 0 * x, x * (g / r))
    if ord_ == 1:
        return xp.sgn(x) * g
    if math.isinf(ord_):  # the gradient of amax/amin: shared evenly among the ties
        hit = abs(x) == r
        ties = xp.sum(hit * 1, axis=dims, keepdims=True)
        return xp.sgn(x) * (g / ties) * hit
    if ord_ < 1:
        return xp.where(x == 0, 0 * x, xp.sgn(x) * abs(x) ** (ord_ - 1)) * g * r ** (1 - ord_)
    scale = xp.where(r == 0, 0 * r, g / r ** (ord_ - 1))
    if ord_ < 2:
        return xp.sgn(x) * abs(x) ** (ord_ - 1) * scale
    return x * abs(x) ** (ord_ - 2) * scale


LinalgVectorNormBackward0 = defop("LinalgVectorNormBackward0", saved=("self", "result"),
                                  vjps=(_norm_vjp,))


def _vector_norm_array(a, ord_, dims, keepdim):
    mag = np.abs(a)
    if ord_ == 2:
        return np.sqrt(np.sum(mag * mag, axis=dims, keepdims=keepdim))
    if ord_ == 1:
        return np.sum(mag, axis=dims, keepdims=keepdim)
    if ord_ == _INF:
        return np.max(mag, axis=dims, keepdims=keepdim)
    if ord_ == -_INF:
        return np.min(mag, axis=dims, keepdims=keepdim)
    if ord_ == 0:
        return np.sum(mag != 0, axis=dims, keepdims=keepdim).astype(mag.dtype)
    with np.errstate(divide="ignore"):
        return np.sum(mag ** ord_, axis=dims, keepdims=keepdim) ** (1.0 / ord_)


def vector_norm(x, ord=2, dim=None, keepdim=False, *, dtype=None, out=None):  # noqa: A002
    """``(sum |x|**ord) ** (1/ord)`` over ``dim`` (all dimensions by default), as
    ``torch.linalg.vector_norm``: ``ord`` 0, inf and -inf are the count of non-zeros,
    the largest and the smallest magnitude."""
    if out is not None:
        raise RuntimeError("linalg.vector_norm(): out= is not supported by distgrad")
    if not isinstance(x, TensorBase):
        raise TypeError(f"linalg.vector_norm(): argument 'x' must be Tensor, not "
                        f"{type(x).__name__}")
    if not (x.is_floating_point() or x.is_complex()):
        raise RuntimeError(f"linalg.vector_norm: Expected a floating point or complex tensor as "
                           f"input. Got {_dtype_name(x).capitalize()}")
    if dtype is not None:
        x = x.to(dtype)
    ord_ = float(ord)
    a = x.detach().numpy()
    dims = _dims(dim, a.ndim)
    if a.ndim and any(a.shape[d] == 0 for d in dims) and (ord_ < 0 or ord_ == _INF):
        raise RuntimeError("linalg.vector_norm cannot compute the {} norm on an empty tensor "
                           "because the operation does not have an identity".format(ord))
    res = np.asarray(_vector_norm_array(a, ord_, dims, keepdim))
    return record(LinalgVectorNormBackward0, res, (x,), (x,),
                  {"ord": ord_, "dims": dims, "keepdim": keepdim})


# ---------------------------------------------------------------------- matrix_norm, norm
def matrix_norm(A, ord="fro", dim=(-2, -1), keepdim=False, *, dtype=None, out=None):  # noqa: N803
    """Frobenius, 1, -1, inf and -inf matrix norms, as ``torch.linalg.matrix_norm``."""
    if out is not None:
        raise RuntimeError("linalg.matrix_norm(): out= is not supported by distgrad")
    if A.dim() < 2:
        raise RuntimeError("linalg.matrix_norm: The input tensor A must have at least 2 "
                           "dimensions.")
    dims = _dims(dim, A.dim())
    if len(dims) != 2:
        raise RuntimeError(f"linalg.matrix_norm: dim must be a 2-tuple. Got {tuple(dim)}")
    if ord == "fro":
        return vector_norm(A, 2, dims, keepdim, dtype=dtype)
    if ord in ("nuc", 2, -2):
        raise NotImplementedError(f"linalg.matrix_norm: ord={ord!r} needs singular values, "
                                  "which distgrad does not compute")
    if ord not in (1, -1, _INF, -_INF):
        raise RuntimeError(f"linalg.matrix_norm: Order {ord} not supported.")
    # PyTorch's: the 1-norm of each column (inf: of each row), then their max (min)
    first, second = dims if abs(ord) == 1 else dims[::-1]
    if not keepdim and first < second:
        second -= 1
    sums = vector_norm(A, 1, first, keepdim, dtype=dtype)
    return (amax if ord > 0 else amin)(sums, second, keepdim)


def norm(A, ord=None, dim=None, keepdim=False, *, dtype=None, out=None):  # noqa: N803, A002
    """``torch.linalg.norm``: a vector norm or, for 2-D ``A`` (or two ``dim``) with an
    ``ord``, a matrix norm; without ``ord`` the 2-norm of all entries."""
    if out is not None:
        raise RuntimeError("linalg.norm(): out= is not supported by distgrad")
    if isinstance(dim, int):
        dim = (dim,)
    if ord is not None:
        if dim is None and A.dim() not in (1, 2):
            raise RuntimeError(f"linalg.norm: If dim is not specified but ord is, the input "
                               f"must be 1D or 2D. Got {A.dim()}D.")
        if (dim is None and A.dim() == 2) or (dim is not None and len(dim) == 2):
            return matrix_norm(A, ord, dim if dim is not None else (-2, -1), keepdim,
                               dtype=dtype)
        if isinstance(ord, str):
            raise RuntimeError(f"linalg.vector_norm: ord={ord!r} is a matrix norm; the input "
                               "is taken as vectors here")
        return vector_norm(A, ord, dim, keepdim, dtype=dtype)
    return vector_norm(A, 2, dim, keepdim, dtype=dtype)

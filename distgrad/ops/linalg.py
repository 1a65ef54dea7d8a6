"""Matrix products: matmul (batched, with NumPy's 1-D rules), mm, bmm, dot, mv, outer, linear."""
import numpy as np

from .promotion import operands
from ..autograd._internal import array_of, cached_output, defop, keep_weight_grad, record

__all__ = ["matmul", "mm", "bmm", "dot", "mv", "outer", "linear"]


def _matmul_vjp_self(xp, g, m, x, y):
    xn, yn = m["ndims"]
    if xn == 1 and yn == 1:
        return g * xp.conj(y)
    if yn == 1:
        return xp.expand_dims(g, -1) * xp.conj(y)
    yt = xp.swapaxes(xp.conj(y), -1, -2)
    if xn == 1:
        return xp.squeeze(xp.matmul(xp.expand_dims(g, -2), yt), -2)
    return xp.matmul(g, yt)


def _matmul_vjp_other(xp, g, m, x, y):
    xn, yn = m["ndims"]
    if xn == 1 and yn == 1:
        return g * xp.conj(x)
    if xn == 1:
        return xp.expand_dims(xp.conj(x), -1) * xp.expand_dims(g, -2)
    xt = xp.swapaxes(xp.conj(x), -1, -2)
    if yn == 1:
        return xp.squeeze(xp.matmul(xt, xp.expand_dims(g, -1)), -1)
    return xp.matmul(xt, g)


_MATMUL_VJPS = (_matmul_vjp_self, _matmul_vjp_other)
MmBackward0 = defop("MmBackward0", saved=("self", "mat2"), pack_reversed=True, vjps=_MATMUL_VJPS)
BmmBackward0 = defop("BmmBackward0", saved=("self", "mat2"), pack_reversed=True, vjps=_MATMUL_VJPS)
DotBackward0 = defop("DotBackward0", saved=("self", "tensor"), vjps=_MATMUL_VJPS)
MvBackward0 = defop("MvBackward0", saved=("self", "vec"), vjps=_MATMUL_VJPS)
MatmulBackward0 = defop("MatmulBackward0", saved=("self", "other"), pack_reversed=True,
                        vjps=_MATMUL_VJPS)


def _node_for(xn, yn):
    if xn == 2 and yn == 2:
        return MmBackward0
    if xn == 3 and yn == 3:
        return BmmBackward0
    if xn == 1 and yn == 1:
        return DotBackward0
    if xn == 2 and yn == 1:
        return MvBackward0
    return MatmulBackward0


def matmul(input, other):
    a, b, ad, bd, dt = operands(input, other)
    if a is None or b is None or ad.ndim == 0 or bd.ndim == 0:
        raise RuntimeError("both arguments to matmul need to be at least 1D, but they are "
                           f"{np.ndim(ad)}D and {np.ndim(bd)}D")
    node = _node_for(ad.ndim, bd.ndim)
    # a product kept by selective checkpointing is not computed again in its recomputation
    res = cached_output(node)
    if res is None:
        try:
            res = np.matmul(ad, bd)
        except ValueError:
            raise RuntimeError(f"mat1 and mat2 shapes cannot be multiplied "
                               f"({_fmt(ad.shape)} and {_fmt(bd.shape)})") from None
    return record(node, np.asarray(res), (a, b), (a, b), {"ndims": (ad.ndim, bd.ndim)})


def _fmt(shape):
    return "x".join(str(s) for s in shape)


def _require(name, t, ndim, what):
    if array_of(t).ndim != ndim:
        raise RuntimeError(f"{name}: {what} must be a {ndim}D tensor, got {array_of(t).ndim}D "
                           f"with shape {list(array_of(t).shape)}")


def mm(input, mat2):
    _require("mm", input, 2, "self")
    _require("mm", mat2, 2, "mat2")
    return matmul(input, mat2)


def bmm(input, mat2):
    _require("bmm", input, 3, "batch1")
    _require("bmm", mat2, 3, "batch2")
    if array_of(input).shape[0] != array_of(mat2).shape[0]:
        raise RuntimeError(f"bmm: batch1 and batch2 must have the same batch size, got "
                           f"{array_of(input).shape[0]} and {array_of(mat2).shape[0]}")
    return matmul(input, mat2)


def dot(input, tensor):
    _require("dot", input, 1, "1st argument")
    _require("dot", tensor, 1, "2nd argument")
    return matmul(input, tensor)


def mv(input, vec):
    _require("mv", input, 2, "self")
    _require("mv", vec, 1, "vec")
    return matmul(input, vec)


def outer(input, vec2):
    return input.reshape(-1, 1) * vec2.reshape(1, -1)


def _linear_vjp_input(xp, g, m, x, w):
    return xp.matmul(g, xp.conj(w))


def _linear_vjp_weight(xp, g, m, x, w):
    if g.ndim != 2:
        out_f, in_f = m["weight_shape"]
        g = xp.reshape(g, (-1, out_f))
        x = xp.reshape(x, (-1, in_f))
    return xp.matmul(xp.swapaxes(g, 0, 1), xp.conj(x))


def _linear_vjp_bias(xp, g, m, x, w):
    return xp.sum(g, axis=tuple(range(g.ndim - 1))) if g.ndim > 1 else g


def _times_weight_transposed(x, w):
    """``x @ w.T`` for a 2-D ``x`` of M rows and a weight of N x K, laid out for the BLAS.

    OpenBLAS (NumPy's) runs ``x @ w.T`` with few rows well below its speed on many:
    one thread, K = N = 1024, it takes 1.9 ms at M = 64 and 0.76 ms at M = 8 where
    ``(w @ x.T).T`` takes 1.4 ms and 0.34 ms (M = 256 the same either way). Pipelines
    and micro-batches live at small M: four micro-batches of a 256 batch cost 1.4x the
    batch in one process with the first layout. The transposed product plus the copy
    into a C-ordered result is faster from M = 2 up to M = 64 once the product is past
    OpenBLAS's small-matrix path (M*N*K > 64**3) and N >= 4M; elsewhere it is slower,
    so this is a choice of layout, not a rewrite (``scripts/bench_rpc_pipeline.py``
    times it end to end in its single-process rows)."""
    m, n = x.shape[0], w.shape[0]
    if 2 <= m <= 64 and n >= 4 * m and m * n * w.shape[1] > 64 ** 3:
        return np.ascontiguousarray(np.matmul(w, x.T).T)
    return np.matmul(x, w.T)


# One fused node for x @ W.T + b: on the benchmark MLP it saves a node and an
# intermediate per layer over matmul + add.
_LinearNode = defop("LinearBackward0", saved=("input", "weight"), vjps=(
    _linear_vjp_input, _linear_vjp_weight, _linear_vjp_bias))


class LinearBackward0(_LinearNode):
    """The weight's gradient may be left for later (``autograd.defer_weight_grads``)."""

    __slots__ = ()

    def apply(self, grads):
        kept = keep_weight_grad(self, grads)
        if kept is None:
            return _LinearNode.apply(self, grads)
        (x, w), (input_needed, _, bias_needed) = kept
        g = grads[0]
        return [_linear_vjp_input(np, g, None, x, w) if input_needed else None, None,
                _linear_vjp_bias(np, g, None, x, w) if bias_needed else None]


LinearBackward0.__module__ = _LinearNode.__module__


def linear(input, weight, bias=None):
    """``input @ weight.T + bias``, as ``torch.nn.functional.linear``."""
    x, w = array_of(input), array_of(weight)
    if w.ndim != 2 or x.ndim == 0 or x.shape[-1] != w.shape[1]:
        rows = int(np.prod(x.shape[:-1])) if x.ndim > 1 else 1
        cols = x.shape[-1] if x.ndim else 1
        raise RuntimeError(f"mat1 and mat2 shapes cannot be multiplied ({rows}x{cols} and "
                           f"{_fmt(w.shape[::-1])})")
    if x.dtype != w.dtype:
        raise RuntimeError(f"mat1 and mat2 must have the same dtype, but got {input.dtype!r} "
                           f"and {weight.dtype!r}")
    out = cached_output(LinearBackward0)  # kept by selective checkpointing: not computed
    if out is None:
        out = _times_weight_transposed(x, w) if x.ndim == 2 else np.matmul(x, w.T)
        if bias is not None:
            out += array_of(bias)
    return record(LinearBackward0, out, (input, weight, bias), (input, weight),
                  {"weight_shape": w.shape})

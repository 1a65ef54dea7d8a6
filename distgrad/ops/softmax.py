"""softmax and log_softmax, each a fused rule (a single node, as in PyTorch)."""
import warnings

import numpy as np

from ..autograd import dtype as _dt
from ..autograd._internal import array_of, wrap_dim, defop, record

__all__ = ["softmax", "log_softmax"]


def _legacy_dim(ndim):
    warnings.warn("Implicit dimension choice for softmax has been deprecated. Change the call "
                  "to include dim=X as an argument.", UserWarning, stacklevel=3)
    return 0 if ndim in (0, 1, 3) else 1


SoftmaxBackward0 = defop("SoftmaxBackward0", saved=("result",), vjps=(
    lambda xp, g, m, r: r * (g - xp.sum(g * r, axis=m["dim"], keepdims=True)),))
LogSoftmaxBackward0 = defop("LogSoftmaxBackward0", saved=("result",), vjps=(
    lambda xp, g, m, r: g - xp.exp(r) * xp.sum(g, axis=m["dim"], keepdims=True),))


def _prepare(input, dim, dtype):
    d = array_of(input)
    if dtype is not None:
        d = d.astype(_dt.to_numpy_dtype(dtype))
    elif d.dtype.kind in "biu":
        raise RuntimeError(f"\"softmax\" not implemented for '{input.dtype!r}'")
    if dim is None:
        dim = _legacy_dim(d.ndim)
    axis = wrap_dim(dim, d.ndim) if d.ndim else None
    shifted = d - d.max(axis=axis, keepdims=True) if d.size else d
    return d, axis, shifted


def softmax(input, dim=None, dtype=None, *, _stacklevel=3):
    d, axis, shifted = _prepare(input, dim, dtype)
    e = np.exp(shifted)
    e /= e.sum(axis=axis, keepdims=True)
    return record(SoftmaxBackward0, e, (input,), (), {"dim": axis})


def log_softmax(input, dim=None, dtype=None, *, _stacklevel=3):
    d, axis, shifted = _prepare(input, dim, dtype)
    out = shifted - np.log(np.exp(shifted).sum(axis=axis, keepdims=True))
    return record(LogSoftmaxBackward0, out, (input,), (), {"dim": axis})

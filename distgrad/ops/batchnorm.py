"""Batch normalisation as one fused node, with PyTorch's running-statistics rules.

Training normalises with the batch's mean and biased variance over every axis
but the channel axis (1), and moves the running estimates towards the batch's
mean and *unbiased* variance by ``momentum``. Evaluation uses the running
estimates. The VJP recomputes the batch statistics from the saved input with
``xp`` operations, so it is differentiable again (double backward).

>>> import distgrad
>>> x = distgrad.randn(8, 3)
>>> mean, var = distgrad.zeros(3), distgrad.ones(3)
>>> y = batch_norm(x, mean, var, training=True)   # mean and var now moved by 0.1
"""
import numpy as np

from .fused import require_floating
from ..autograd._internal import array_of, bump_version, defop, record

__all__ = ["batch_norm"]


def _batch_norm_vjp(xp, grads, m, needs, x, *weight):
    g = grads[0]
    axes, shape = m["axes"], m["shape"]
    if m["training"]:
        n = m["count"]
        centered = x - xp.sum(x, axes, keepdims=True) / n
        invstd = 1.0 / xp.sqrt(xp.sum(centered * centered, axes, keepdims=True) / n + m["eps"])
    else:
        centered = x - m["running_mean"]
        invstd = m["running_invstd"]
    normalized = centered * invstd
    dx = None
    if needs[0]:
        gw = g * xp.reshape(weight[0], shape) if weight else g
        if m["training"]:
            mean_gw = xp.sum(gw, axes, keepdims=True) / n
            proj = xp.sum(gw * normalized, axes, keepdims=True) / n
            dx = (gw - mean_gw - normalized * proj) * invstd
        else:
            dx = gw * invstd
    return (dx,
            xp.sum(g * normalized, axes) if needs[1] else None,
            xp.sum(g, axes) if needs[2] else None)


NativeBatchNormBackward0 = defop("NativeBatchNormBackward0", saved=("input", "weight"),
                                 vjp_all=_batch_norm_vjp)


def _check_stat(name, t, channels):
    if t is not None and array_of(t).size != channels:
        raise RuntimeError(f"{name} should contain {channels} elements not {array_of(t).size}")


def batch_norm(input, running_mean, running_var, weight=None, bias=None, training=False,
               momentum=0.1, eps=1e-5):
    """Normalise (N, C, ...) per channel, as ``torch.nn.functional.batch_norm``.

    With ``training`` the running statistics (if given) are updated in place.
    """
    x = array_of(input)
    if x.ndim < 2:
        raise RuntimeError(f"batch_norm: expected an input of at least 2 dimensions (N, C, ...), "
                         f"got input of size {list(x.shape)}")
    require_floating("batch_norm", input)
    channels = x.shape[1]
    count = x.size // channels if channels else 0
    if training and count == 1:
        raise ValueError(f"Expected more than 1 value per channel when training, got input size "
                         f"{input.size()}")
    if training and eps <= 0.0:
        raise ValueError(f"batch_norm eps must be positive during training, but got {eps}")
    if eps < 0.0:
        raise ValueError(f"batch_norm eps must be non-negative, but got {eps}")
    for name, t in (("running_mean", running_mean), ("running_var", running_var),
                    ("weight", weight), ("bias", bias)):
        _check_stat(name, t, channels)
    axes = (0,) + tuple(range(2, x.ndim))
    shape = (1, channels) + (1,) * (x.ndim - 2)
    meta = {"training": training, "eps": eps, "axes": axes, "shape": shape, "count": count}
    if training:
        mean = x.mean(axis=axes)
        var = x.var(axis=axes)
        if running_mean is not None:
            _move_towards(running_mean, mean, momentum)
        if running_var is not None:
            _move_towards(running_var, var * (count / max(count - 1, 1)), momentum)
    else:
        if running_mean is None or running_var is None:
            raise RuntimeError("running_mean must be defined in evaluation mode")
        mean, var = array_of(running_mean), array_of(running_var)
        meta["running_mean"] = mean.reshape(shape).astype(x.dtype)
        meta["running_invstd"] = (1.0 / np.sqrt(var + eps)).reshape(shape).astype(x.dtype)
    scale = 1.0 / np.sqrt(var + eps)
    shift = -mean * scale
    if weight is not None:
        scale = scale * array_of(weight)
        shift = shift * array_of(weight)
    if bias is not None:
        shift = shift + array_of(bias)
    out = x * scale.astype(x.dtype).reshape(shape) + shift.astype(x.dtype).reshape(shape)
    saved = (input,) if weight is None else (input, weight)
    return record(NativeBatchNormBackward0, out, (input, weight, bias), saved, meta)


def _move_towards(running, value, momentum):
    """``running = (1 - momentum) * running + momentum * value``, in place, as a new version."""
    data = array_of(running)
    data *= 1 - momentum
    data += (momentum * value).astype(data.dtype, copy=False)
    bump_version(running)

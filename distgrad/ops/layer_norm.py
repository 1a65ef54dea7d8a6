"""Layer normalisation as one fused node (PyTorch's ``NativeLayerNormBackward0``).

Written from primitives it is ten nodes and a dozen full-size temporaries per call;
a transformer calls it twice per block. The forward keeps the rows' mean and
reciprocal standard deviation (small: one value per row) for the backward, which
in an ordinary backward is the hand-written NumPy VJP

    dx = rstd * (g*w - mean(g*w) - xhat * mean(g*w * xhat)),  xhat = (x - mean) * rstd

and under ``create_graph`` the same formula in ``xp`` operations on the saved
input, so it is differentiable again (double backward).

>>> import distgrad
>>> x = distgrad.randn(2, 5, requires_grad=True)
>>> w, b = distgrad.ones(5, requires_grad=True), distgrad.zeros(5, requires_grad=True)
>>> layer_norm(x, (5,), w, b).grad_fn.name()
'NativeLayerNormBackward0'
"""
import numpy as np

from ..autograd._internal import array_of, defop, record

__all__ = ["layer_norm"]

_add_reduce = np.add.reduce


def _layer_norm_vjp(xp, grads, m, needs, x, *weight):
    g = grads[0]
    if xp.is_tensor_backend():
        return _differentiable_vjp(xp, g, m, needs, x, weight[0] if weight else None)
    axes, lead, n = m["axes"], m["lead_axes"], m["count"]
    xhat = x - m["mean"]
    xhat *= m["rstd"]
    dw = _add_reduce(g * xhat, axis=lead) if needs[1] else None
    db = _add_reduce(g, axis=lead) if needs[2] else None
    dx = None
    if needs[0]:
        gw = g * weight[0] if weight else g.copy()
        mean_gw = _add_reduce(gw, axis=axes, keepdims=True)
        mean_gw /= n
        proj = _add_reduce(gw * xhat, axis=axes, keepdims=True)
        proj /= n
        xhat *= proj
        gw -= xhat
        gw -= mean_gw
        gw *= m["rstd"]
        dx = gw
    return dx, dw, db


def _differentiable_vjp(xp, g, m, needs, x, weight):
    axes, lead, n = m["axes"], m["lead_axes"], m["count"]
    centered = x - xp.sum(x, axes, keepdims=True) / n
    rstd = 1.0 / xp.sqrt(xp.sum(centered * centered, axes, keepdims=True) / n + m["eps"])
    xhat = centered * rstd
    dx = None
    if needs[0]:
        gw = g * weight if weight is not None else g
        mean_gw = xp.sum(gw, axes, keepdims=True) / n
        proj = xp.sum(gw * xhat, axes, keepdims=True) / n
        dx = (gw - mean_gw - xhat * proj) * rstd
    return (dx,
            xp.sum(g * xhat, lead) if needs[1] else None,
            xp.sum(g, lead) if needs[2] else None)


NativeLayerNormBackward0 = defop("NativeLayerNormBackward0", saved=("input", "weight"),
                                 vjp_all=_layer_norm_vjp)


def layer_norm(input, normalized_shape, weight=None, bias=None, eps=1e-5):
    """Normalise over the trailing ``normalized_shape`` dimensions (biased variance), then
    scale by ``weight`` and shift by ``bias``; the caller has checked the shapes."""
    x = array_of(input)
    k = len(normalized_shape)
    axes = tuple(range(x.ndim - k, x.ndim))
    count = 1
    for size in normalized_shape:
        count *= size
    mean = _add_reduce(x, axis=axes, keepdims=True)
    mean /= count
    out = x - mean
    var = _add_reduce(out * out, axis=axes, keepdims=True)
    var /= count
    var += eps
    rstd = np.sqrt(var, out=var)
    np.reciprocal(rstd, out=rstd)
    out *= rstd
    if weight is not None:
        out *= array_of(weight)
    if bias is not None:
        out += array_of(bias)
    meta = {"axes": axes, "lead_axes": tuple(range(x.ndim - k)), "count": count, "eps": eps,
            "mean": mean, "rstd": rstd}
    saved = (input,) if weight is None else (input, weight)
    return record(NativeLayerNormBackward0, out, (input, weight, bias), saved, meta)

"""Elementwise unary ops and activations, forward and VJP side by side.

Non-differentiable points follow PyTorch: relu'(0) = 0, abs'(0) = 0,
sqrt'(0) = inf, clamp passes the gradient at its bounds.
"""
import math

import numpy as np

from ..autograd import dtype as _dt
from ..autograd.tensor import TensorBase
from ..autograd._internal import array_of, wrap, defop, record
from . import np_backend
from .erf import erf as erf_array
from .indexing import where

__all__ = ["exp", "log", "log2", "log10", "log1p", "expm1", "sqrt", "rsqrt", "abs", "absolute",
           "sin", "cos", "tan", "tanh", "sigmoid", "relu", "gelu", "erf", "clamp", "clip",
           "clamp_min", "clamp_max", "sign", "sgn", "floor", "ceil", "round", "trunc", "silu",
           "softplus", "leaky_relu", "elu"]

_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)
_INV_SQRT_2 = 1.0 / math.sqrt(2.0)
_INV_SQRT_2PI = 1.0 / math.sqrt(2.0 * math.pi)
_TWO_OVER_SQRT_PI = 2.0 / math.sqrt(math.pi)


def _floating(x):
    """Integer inputs of floating ops compute in the default dtype, as in PyTorch."""
    d = array_of(x)
    if d.dtype.kind in "biu":
        return d.astype(_dt.get_default_dtype().numpy)
    return d


def _defunary(name, forward, node, quiet=False):
    """An elementwise op. ``quiet`` ops cannot raise floating-point warnings, so they skip
    ``np.errstate`` (it costs more than a small tanh)."""
    saves_input = "self" in node._saved_names

    def op(input):
        x = _floating(input)
        if quiet:
            res = forward(x)
        else:
            with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
                res = forward(x)
        return record(node, res, (input,), (input,) if saves_input else ())
    op.__name__ = name
    op.__qualname__ = name
    op.__doc__ = f"Elementwise ``{name}`` with autograd support."
    return op


ExpBackward0 = defop("ExpBackward0", saved=("result",), vjps=(lambda xp, g, m, r: g * xp.conj(r),))
LogBackward0 = defop("LogBackward0", saved=("self",), vjps=(lambda xp, g, m, x: g / xp.conj(x),))
Log2Backward0 = defop("Log2Backward0", saved=("self",),
                      vjps=(lambda xp, g, m, x: g / (xp.conj(x) * math.log(2.0)),))
Log10Backward0 = defop("Log10Backward0", saved=("self",),
                       vjps=(lambda xp, g, m, x: g / (xp.conj(x) * math.log(10.0)),))
Log1PBackward0 = defop("Log1PBackward0", saved=("self",),
                       vjps=(lambda xp, g, m, x: g / xp.conj(x + 1),))
Expm1Backward0 = defop("Expm1Backward0", saved=("result",),
                       vjps=(lambda xp, g, m, r: g * xp.conj(r + 1),))
SqrtBackward0 = defop("SqrtBackward0", saved=("result",),
                      vjps=(lambda xp, g, m, r: g / (2 * xp.conj(r)),))
RsqrtBackward0 = defop("RsqrtBackward0", saved=("result",),
                       vjps=(lambda xp, g, m, r: -0.5 * g * xp.conj(r * r * r),))
AbsBackward0 = defop("AbsBackward0", saved=("self",), vjps=(lambda xp, g, m, x: g * xp.sgn(x),))
SinBackward0 = defop("SinBackward0", saved=("self",),
                     vjps=(lambda xp, g, m, x: g * xp.conj(xp.cos(x)),))
CosBackward0 = defop("CosBackward0", saved=("self",),
                     vjps=(lambda xp, g, m, x: g * -xp.conj(xp.sin(x)),))
TanBackward0 = defop("TanBackward0", saved=("result",),
                     vjps=(lambda xp, g, m, r: g * xp.conj(1 + r * r),))
TanhBackward0 = defop("TanhBackward0", saved=("result",),
                      vjps=(lambda xp, g, m, r: xp.tanh_backward(g, r),))
SigmoidBackward0 = defop("SigmoidBackward0", saved=("result",),
                         vjps=(lambda xp, g, m, r: g * xp.conj(r * (1 - r)),))
# Under create_graph, sign(result) (= the mask, as result >= 0) keeps the first
# gradient attached to the graph with a zero derivative, as PyTorch's threshold_backward.
ReluBackward0 = defop("ReluBackward0", saved=("result",), vjps=(
    lambda xp, g, m, r: g * xp.sign(r) if xp.is_tensor_backend() else xp.mask(g, r > 0),))
ErfBackward0 = defop("ErfBackward0", saved=("self",),
                     vjps=(lambda xp, g, m, x: g * (_TWO_OVER_SQRT_PI * xp.exp(-(x * x))),))
# floor, ceil, round, trunc, sign: zero almost everywhere, as in PyTorch.
ZeroGradBackward = {n: defop(n, vjps=(lambda xp, g, m: g * 0,))
                    for n in ("FloorBackward0", "CeilBackward0", "RoundBackward0", "TruncBackward0",
                              "SignBackward0")}


def _raw(x):
    return array_of(x) if isinstance(x, TensorBase) else x



exp = _defunary("exp", np.exp, ExpBackward0)
log = _defunary("log", np.log, LogBackward0)
log2 = _defunary("log2", np.log2, Log2Backward0)
log10 = _defunary("log10", np.log10, Log10Backward0)
log1p = _defunary("log1p", np.log1p, Log1PBackward0)
expm1 = _defunary("expm1", np.expm1, Expm1Backward0)
sqrt = _defunary("sqrt", np.sqrt, SqrtBackward0)
rsqrt = _defunary("rsqrt", lambda a: 1.0 / np.sqrt(a), RsqrtBackward0)
sin = _defunary("sin", np.sin, SinBackward0)
cos = _defunary("cos", np.cos, CosBackward0)
tan = _defunary("tan", np.tan, TanBackward0)
tanh = _defunary("tanh", np.tanh, TanhBackward0, quiet=True)
erf = _defunary("erf", np_backend.erf, ErfBackward0)


def _sigmoid_array(a):
    if a.dtype.kind == "c":
        return 1 / (1 + np.exp(-a))
    # 1 / (1 + exp(-a)) is exact at both ends in floating point: exp(-a) overflows to inf
    # (sigmoid 0) or underflows to 0 (sigmoid 1), which errstate keeps quiet.
    out = np.negative(a, out=np.empty_like(a))  # out=: a 0-d result stays an array
    with np.errstate(over="ignore"):
        np.exp(out, out=out)
    out += 1
    np.reciprocal(out, out=out)
    return out


sigmoid = _defunary("sigmoid", _sigmoid_array, SigmoidBackward0, quiet=True)


def abs(input):  # noqa: A001
    d = array_of(input)
    if d.dtype.kind == "b":
        raise RuntimeError("abs is not implemented for bool tensors")
    return record(AbsBackward0, np.abs(d), (input,), (input,))


absolute = abs


def relu(input):
    d = array_of(input)
    if d.dtype.kind == "c":
        raise RuntimeError("clamp is not supported for complex types")
    return record(ReluBackward0, np.maximum(d, 0), (input,))


def _gelu_vjp(xp, g, m, x):
    if m["approximate"] == "tanh" and not xp.is_tensor_backend():
        return _gelu_tanh_grad(g, x)
    if m["approximate"] == "tanh":
        kappa = 0.044715
        x_sq = x * x
        inner = _SQRT_2_OVER_PI * (x + kappa * x_sq * x)
        t = xp.tanh(inner)
        left = 0.5 * x
        right = 1 + t
        return g * (0.5 * right + left * (1 - t * t) * _SQRT_2_OVER_PI * (1 + 3 * kappa * x_sq))
    if not xp.is_tensor_backend():
        return _gelu_exact_grad(g, x)
    cdf = 0.5 * (1 + xp.erf(x * _INV_SQRT_2))
    pdf = xp.exp(-0.5 * x * x) * _INV_SQRT_2PI
    return g * (cdf + x * pdf)


def _square(x):
    """``x * x`` as a new floating array to work in place on (also for 0-d ``x``, where
    NumPy would return an immutable scalar)."""
    return np.multiply(x, x, out=np.empty(x.shape, np.result_type(x.dtype, 0.5)))


def _gelu_tanh_inner(x):
    """``tanh(sqrt(2/pi) * (x + 0.044715 x^3))`` on one temporary."""
    t = _square(x)
    t *= 0.044715
    t += 1
    t *= x
    t *= _SQRT_2_OVER_PI
    return np.tanh(t, out=t)


def _gelu_tanh_grad(g, x):
    """``g * (0.5 (1 + t) + 0.5 x (1 - t^2) sqrt(2/pi) (1 + 3 * 0.044715 x^2))`` in place
    on two temporaries (the tanh GELU's backward)."""
    t = _gelu_tanh_inner(x)
    d = _square(x)
    d *= 3 * 0.044715
    d += 1
    d *= x
    d *= _SQRT_2_OVER_PI
    d *= 1 - t * t
    t += 1
    d += t
    d *= 0.5
    d *= g
    return d


def _normal_cdf(x):
    """``0.5 * (1 + erf(x / sqrt(2)))`` with one temporary besides erf's."""
    cdf = erf_array(x * _INV_SQRT_2)
    cdf += 1
    cdf *= 0.5
    return cdf


def _gelu_exact_grad(g, x):
    """``g * (cdf(x) + x * pdf(x))`` in NumPy, in place on two temporaries (GELU's
    backward is one of a transformer's largest elementwise steps)."""
    pdf = _square(x)
    pdf *= -0.5
    np.exp(pdf, out=pdf)
    pdf *= x
    pdf *= _INV_SQRT_2PI
    pdf += _normal_cdf(x)
    pdf *= g
    return pdf


GeluBackward0 = defop("GeluBackward0", saved=("self",), vjps=(_gelu_vjp,))


def gelu(input, approximate="none"):
    if approximate not in ("none", "tanh"):
        raise RuntimeError(f"approximate argument must be either none or tanh, got {approximate!r}")
    x = array_of(input)
    if approximate == "tanh":
        res = _gelu_tanh_inner(x)
        res += 1
        res *= x
        res *= 0.5
    else:
        res = _normal_cdf(x)
        res *= x
    return record(GeluBackward0, res.astype(x.dtype, copy=False), (input,), (input,),
                  {"approximate": approximate})


def _clamp_self_vjp(xp, g, m, x, lo, hi):
    keep = np.ones(_raw(x).shape, dtype=bool)
    if lo is not None:
        keep &= _raw(x) >= _raw(lo)
    if hi is not None:
        keep &= _raw(x) <= _raw(hi)
    return xp.mask(g, keep)


ClampBackward1 = defop("ClampBackward1", saved=("self",), vjps=(
    lambda xp, g, m, x: _clamp_self_vjp(xp, g, m, x, m["min"], m["max"]),))
ClampBackward0 = defop("ClampBackward0", saved=("self", "min", "max"), pack_reversed=True, vjps=(
    lambda xp, g, m, x, lo, hi: _clamp_self_vjp(xp, g, m, x, lo if m["has_min"] else None,
                                                hi if m["has_max"] else None),
    lambda xp, g, m, x, lo, hi: xp.mask(g, _raw(x) < _raw(lo)),
    lambda xp, g, m, x, lo, hi: xp.mask(g, _raw(x) > _raw(hi))))


def clamp(input, min=None, max=None):  # noqa: A002
    if min is None and max is None:
        raise RuntimeError("At least one of 'min' or 'max' must not be None")
    x = array_of(input)
    if isinstance(min, TensorBase) or isinstance(max, TensorBase):
        lo = min if isinstance(min, TensorBase) else (
            wrap(np.asarray(min, x.dtype)) if min is not None else None)
        hi = max if isinstance(max, TensorBase) else (
            wrap(np.asarray(max, x.dtype)) if max is not None else None)
        res = x
        if lo is not None:
            res = np.maximum(res, array_of(lo))
        if hi is not None:
            res = np.minimum(res, array_of(hi))
        res = np.array(res, dtype=x.dtype, copy=True) if res is x else res.astype(x.dtype, copy=False)
        dummy = wrap(np.zeros((), x.dtype))
        return record(ClampBackward0, res, (input, lo, hi),
                      (input, lo if lo is not None else dummy, hi if hi is not None else dummy),
                      {"has_min": lo is not None, "has_max": hi is not None})
    res = np.clip(x, min, max)
    if res.dtype != x.dtype:
        res = res.astype(x.dtype)
    return record(ClampBackward1, res, (input,), (input,), {"min": min, "max": max})


clip = clamp


def clamp_min(input, min):  # noqa: A002
    return clamp(input, min=min)


def clamp_max(input, max):  # noqa: A002
    return clamp(input, max=max)


def _zero_grad_op(name, fn, node_name):
    node = ZeroGradBackward[node_name]

    def op(input):
        return record(node, fn(array_of(input)), (input,))
    op.__name__ = name
    return op


floor = _zero_grad_op("floor", np.floor, "FloorBackward0")
ceil = _zero_grad_op("ceil", np.ceil, "CeilBackward0")
trunc = _zero_grad_op("trunc", np.trunc, "TruncBackward0")
sign = _zero_grad_op("sign", np.sign, "SignBackward0")


def round(input, *, decimals=0):  # noqa: A001
    return record(ZeroGradBackward["RoundBackward0"], np.round(array_of(input), decimals), (input,))


def sgn(input):
    if array_of(input).dtype.kind != "c":
        return sign(input)
    return wrap(np_backend.sgn(array_of(input)))


# Composite activations, written from the primitives above.
def silu(input):
    return input * sigmoid(input)


def softplus(input, beta=1.0, threshold=20.0):
    scaled = input * beta
    return where(scaled > threshold, input, log1p(exp(scaled)) / beta)


def leaky_relu(input, negative_slope=0.01):
    return where(input > 0, input, input * negative_slope)


def elu(input, alpha=1.0):
    return where(input > 0, input, alpha * expm1(input))

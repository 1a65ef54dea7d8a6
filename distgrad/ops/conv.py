"""Convolution (``conv1d``, ``conv2d``) as one fused node, with PyTorch's semantics.

Forward is im2col: a strided window view of the padded input
(``sliding_window_view``, no copy) gathered once into columns, times the weight
in one matmul per group. Backward does the same two contractions the other way:
the weight gradient is grad^T @ columns, the input gradient is grad @ weight
scattered back over the windows (col2im, one strided add per kernel offset).

The three maps

    convolution(x, w)       -> y
    conv_input_grad(g, w)   -> dx
    conv_weight_grad(x, g)  -> dw

are the partial contractions of one trilinear form <conv(x, w), g>, so the VJPs
of each are the other two. Under ``create_graph=True`` they record one another as
fused nodes, and gradients of any order (a gradient penalty through a CNN) stay
at one node per convolution.

>>> import distgrad
>>> x = distgrad.randn(2, 3, 8, 8)
>>> w = distgrad.randn(4, 3, 3, 3, requires_grad=True)
>>> conv2d(x, w, padding=1).shape
distgrad.Size([2, 4, 8, 8])
"""
import itertools
import numbers

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from .fused import call_fused, require_floating, scalar_type_name
from ..autograd._internal import array_of, defop, record

__all__ = ["conv1d", "conv2d", "convolution", "expand_param", "pad_trailing", "window_view",
           "convolution_map", "input_grad_map", "weight_grad_map", "check_operands",
           "expand_positive"]


# ---------------------------------------------------------------- window geometry
def window_view(padded, kernel, stride, dilation, out):
    """The windows of ``padded`` (..., *S) as a view (..., *out, *kernel), no copy."""
    d = len(kernel)
    span = tuple(dl * (k - 1) + 1 for k, dl in zip(kernel, dilation))
    win = sliding_window_view(padded, span, axis=tuple(range(padded.ndim - d, padded.ndim)))
    key = (Ellipsis,) + tuple(slice(0, (o - 1) * s + 1, s) for o, s in zip(out, stride)) + \
        tuple(slice(None, None, dl) for dl in dilation)
    return win[key]


def pad_trailing(a, padding, value=0):
    """Pad the trailing ``len(padding)`` axes by ``(before, after)`` pairs."""
    if not any(lo or hi for lo, hi in padding):
        return a
    widths = ((0, 0),) * (a.ndim - len(padding)) + tuple(padding)
    return np.pad(a, widths, constant_values=value)


def _conv_out(spatial, kernel, m):
    return tuple((n + lo + hi - dl * (k - 1) - 1) // s + 1
                 for n, k, (lo, hi), s, dl in zip(spatial, kernel, m["padding"], m["stride"],
                                                  m["dilation"]))


def _columns(x, kernel, out, m):
    """Input windows as matmul operands: (N, groups, C/groups * prod(kernel), prod(out)).

    Output positions stay the last (fastest) axis, so the gathering copy moves
    whole rows of windows, and the product with the weight comes out as (N, O, *out).
    """
    n, c = x.shape[:2]
    g, d = m["groups"], len(kernel)
    win = window_view(pad_trailing(x, m["padding"]), kernel, m["stride"], m["dilation"], out)
    win = win.reshape((n, g, c // g) + win.shape[2:])  # splits an axis of the view: no copy
    perm = (0, 1, 2) + tuple(range(3 + d, 3 + 2 * d)) + tuple(range(3, 3 + d))
    return win.transpose(perm).reshape(n, g, -1, int(np.prod(out)))


# ---------------------------------------------------------------- the three kernels
def _conv_np(x, w, m):
    n, o = x.shape[0], w.shape[0]
    g, kernel = m["groups"], w.shape[2:]
    out = _conv_out(x.shape[2:], kernel, m)
    y = np.matmul(w.reshape(g, o // g, -1), _columns(x, kernel, out, m))  # (N, G, O/G, L)
    return y.reshape((n, o) + out)


def _weight_grad_np(x, gy, m):
    w_shape = m["weight_shape"]
    n, o = gy.shape[:2]
    g = m["groups"]
    cols = _columns(x, w_shape[2:], gy.shape[2:], m)
    rows = gy.reshape(n, g, o // g, -1)
    return np.matmul(rows, cols.transpose(0, 1, 3, 2)).sum(0).reshape(w_shape)


def _input_grad_np(gy, w, m):
    x_shape = m["input_shape"]
    n, c = x_shape[:2]
    g, kernel = m["groups"], w.shape[2:]
    o = w.shape[0]
    w_t = w.reshape(g, o // g, -1).transpose(0, 2, 1)  # (G, C/G*K, O/G)
    padded = tuple(s + lo + hi for s, (lo, hi) in zip(x_shape[2:], m["padding"]))
    if all(s == 1 for s in m["stride"]):
        dx = _col2im_unit_stride(w_t, gy, padded, kernel, m["dilation"], (n, g, c // g))
    else:
        dx = _col2im_strided(w_t, gy, padded, kernel, m, (n, g, c // g))
    dx = dx.reshape((n, c) + padded)
    crop = (Ellipsis,) + tuple(slice(lo, lo + s) for s, (lo, hi) in zip(x_shape[2:], m["padding"]))
    return dx[crop]


def _col2im_unit_stride(w_t, gy, padded, kernel, dilation, lead):
    """col2im for stride 1, as one contiguous add per kernel offset.

    With the gradient's trailing spatial axes zero-padded to the input's padded
    sizes, the window of kernel offset k covers the flattened input from a fixed
    offset on, contiguously; the zero columns land on positions they do not change.
    """
    n, g = lead[:2]
    out = gy.shape[2:]
    wide = np.zeros(gy.shape[:3] + padded[1:], dtype=gy.dtype)
    wide[(Ellipsis,) + tuple(slice(0, o_) for o_ in out[1:])] = gy
    span = int(np.prod(wide.shape[2:]))
    dcols = np.matmul(w_t, wide.reshape(n, g, -1, span))       # (N, G, C/G*K, span)
    dcols = dcols.reshape(lead + (int(np.prod(kernel)), span))
    flat_strides = [int(np.prod(padded[i + 1:])) for i in range(len(padded))]
    size = int(np.prod(padded))
    tail = max(0, sum((k - 1) * dl * st for k, dl, st in zip(kernel, dilation, flat_strides))
               + span - size)
    dx = np.zeros(lead + (size + tail,), dtype=dcols.dtype)
    for k, offset in enumerate(itertools.product(*(range(k) for k in kernel))):
        start = sum(i * dl * st for i, dl, st in zip(offset, dilation, flat_strides))
        dx[..., start:start + span] += dcols[..., k, :]
    return dx[..., :size]


def _col2im_strided(w_t, gy, padded, kernel, m, lead):
    """col2im for any stride: one strided add per kernel offset."""
    n, g = lead[:2]
    out = gy.shape[2:]
    dcols = np.matmul(w_t, gy.reshape(n, g, w_t.shape[2], -1))   # (N, G, C/G*K, L)
    dcols = dcols.reshape(lead + kernel + out)
    dx = np.zeros(lead + padded, dtype=dcols.dtype)
    for offset in itertools.product(*(range(k) for k in kernel)):
        key = (Ellipsis,) + tuple(slice(k * dl, k * dl + (o_ - 1) * s + 1, s) for k, dl, o_, s
                                  in zip(offset, m["dilation"], out, m["stride"]))
        dx[key] += dcols[(slice(None),) * 3 + offset]
    return dx


# ---------------------------------------------------------------- nodes and their VJPs
def _conv(xp, x, w, m):
    return call_fused(xp, ConvolutionDoubleBackward, _conv_np, (x, w), m)


def _input_grad(xp, gy, w, m):
    return call_fused(xp, ConvolutionInputGradBackward, _input_grad_np, (gy, w), m)


def _weight_grad(xp, x, gy, m):
    return call_fused(xp, ConvolutionWeightGradBackward, _weight_grad_np, (x, gy), m)


def _convolution_vjp(xp, grads, m, needs, x, w):
    gy = grads[0]
    return (_input_grad(xp, gy, w, m) if needs[0] else None,
            _weight_grad(xp, x, gy, m) if needs[1] else None,
            xp.sum(gy, axis=(0,) + tuple(range(2, len(m["input_shape"])))) if needs[2] else None)


def _conv_no_bias_vjp(xp, grads, m, needs, x, w):
    return _convolution_vjp(xp, grads, m, needs + (False,), x, w)[:2]


def _input_grad_vjp(xp, grads, m, needs, gy, w):
    u = grads[0]  # shaped like the convolution's input
    return (_conv(xp, u, w, m) if needs[0] else None,
            _weight_grad(xp, u, gy, m) if needs[1] else None)


def _weight_grad_vjp(xp, grads, m, needs, x, gy):
    v = grads[0]  # shaped like the weight
    return (_input_grad(xp, gy, v, m) if needs[0] else None,
            _conv(xp, x, v, m) if needs[1] else None)


ConvolutionBackward0 = defop("ConvolutionBackward0", saved=("input", "weight"),
                             vjp_all=_convolution_vjp)

#: The three maps of the trilinear form, each ``(xp, a, b, meta)``, for the transposed
#: convolution (``ops/conv_transpose.py``): its forward is the input-gradient map and
#: its gradients are the other two.
convolution_map, input_grad_map, weight_grad_map = _conv, _input_grad, _weight_grad
# The same map without a bias, recorded when a gradient is itself differentiated.
ConvolutionDoubleBackward = defop("ConvolutionBackwardBackward0", saved=("input", "weight"),
                                  vjp_all=_conv_no_bias_vjp)
ConvolutionInputGradBackward = defop("ConvolutionInputGradBackward0",
                                     saved=("grad_output", "weight"), vjp_all=_input_grad_vjp)
ConvolutionWeightGradBackward = defop("ConvolutionWeightGradBackward0",
                                      saved=("input", "grad_output"), vjp_all=_weight_grad_vjp)


# ---------------------------------------------------------------- argument handling
def expand_param(value, n, name, what="convolution"):
    """``3`` or ``(3,)`` or ``[3, 3]`` as an n-tuple of ints, with PyTorch's error otherwise."""
    if isinstance(value, numbers.Integral):
        return (int(value),) * n
    values = tuple(value)
    if len(values) == 1:
        values = values * n
    if len(values) != n or not all(isinstance(v, numbers.Integral) for v in values):
        raise RuntimeError(f"expected {name} to be a single integer value or a list of {n} values "
                           f"to match the {what} dimensions, but got {name}={list(values)}")
    return tuple(int(v) for v in values)


def _padding_pairs(padding, kernel, stride, dilation):
    if isinstance(padding, str):
        if padding == "valid":
            return ((0, 0),) * len(kernel)
        if padding != "same":
            raise RuntimeError(f"Invalid padding string: {padding!r}")
        if any(s != 1 for s in stride):
            raise RuntimeError("padding='same' is not supported for strided convolutions")
        # PyTorch puts the odd one out of an even total on the right.
        return tuple((dl * (k - 1) // 2, dl * (k - 1) - dl * (k - 1) // 2)
                     for k, dl in zip(kernel, dilation))
    pads = expand_param(padding, len(kernel), "padding")
    if any(p < 0 for p in pads):
        raise RuntimeError("negative padding is not supported")
    return tuple((p, p) for p in pads)


def check_operands(name, input, weight, bias, d, weight_layout="out_channels, in_channels/groups"):
    """PyTorch's checks of a (transposed) convolution's operands: the input's and the
    weight's dimensions, floating point, one dtype. Returns their arrays."""
    x, w = array_of(input), array_of(weight)
    if x.ndim not in (d + 1, d + 2):
        raise RuntimeError(f"Expected {d + 1}D (unbatched) or {d + 2}D (batched) input to {name}, "
                           f"but got input of size: {list(x.shape)}")
    if w.ndim != d + 2:
        raise RuntimeError(f"{name}: expected weight to be {d + 2}-dimensional ({weight_layout}, "
                           f"kernel...), but got weight of size {list(w.shape)}")
    require_floating(name, input, weight, bias)
    if x.dtype != w.dtype or (bias is not None and array_of(bias).dtype != x.dtype):
        other = w.dtype if x.dtype != w.dtype else array_of(bias).dtype
        raise RuntimeError(f"{name}: expected scalar type {scalar_type_name(x.dtype)} but found "
                           f"{scalar_type_name(other)} (input, weight and bias must share a dtype)")
    return x, w


def expand_positive(value, n, name):
    """:func:`expand_param` of a stride or dilation, which must be positive."""
    values = expand_param(value, n, name)
    if any(v <= 0 for v in values):
        raise RuntimeError(f"non-positive {name} is not supported")
    return values


def convolution(input, weight, bias, stride, padding, dilation, groups, d):
    """The d-dimensional convolution of batched or unbatched ``input``; see :func:`conv2d`."""
    name = f"conv{d}d"
    x, w = check_operands(name, input, weight, bias, d)
    stride = expand_positive(stride, d, "stride")
    dilation = expand_positive(dilation, d, "dilation")
    if groups <= 0:
        raise RuntimeError("non-positive groups is not supported")
    kernel = w.shape[2:]
    pads = _padding_pairs(padding, kernel, stride, dilation)
    unbatched = x.ndim == d + 1
    if unbatched:
        input = input.unsqueeze(0)
        x = array_of(input)
    if w.shape[0] % groups:
        raise RuntimeError(f"Given groups={groups}, expected weight to be divisible by {groups} at "
                           f"dimension 0, but got weight of size [{list(w.shape)}] instead")
    if x.shape[1] != w.shape[1] * groups:
        raise RuntimeError(f"Given groups={groups}, weight of size {list(w.shape)}, expected "
                           f"input{list(x.shape)} to have {w.shape[1] * groups} channels, but got "
                           f"{x.shape[1]} channels instead")
    if bias is not None and array_of(bias).shape != (w.shape[0],):
        raise RuntimeError(f"Given weight of size {list(w.shape)}, expected bias to be "
                           f"1-dimensional with {w.shape[0]} elements, but got bias of size "
                           f"{list(array_of(bias).shape)} instead")
    padded = [s + lo + hi for s, (lo, hi) in zip(x.shape[2:], pads)]
    span = [dl * (k - 1) + 1 for k, dl in zip(kernel, dilation)]
    if any(p < k for p, k in zip(padded, span)):
        raise RuntimeError(f"Calculated padded input size per channel: "
                           f"({' x '.join(map(str, padded))}). Kernel size: "
                           f"({' x '.join(map(str, span))}). Kernel size can't be greater than "
                           "actual input size")
    meta = {"stride": stride, "padding": pads, "dilation": dilation, "groups": groups,
            "input_shape": x.shape, "weight_shape": w.shape}
    out = _conv_np(x, w, meta)
    if bias is not None:
        out += array_of(bias).reshape((-1,) + (1,) * d)
    result = record(ConvolutionBackward0, out, (input, weight, bias), (input, weight), meta)
    return result.squeeze(0) if unbatched else result


def conv1d(input, weight, bias=None, stride=1, padding=0, dilation=1, groups=1):
    """1-D convolution over (N, C, L) or (C, L), as ``torch.nn.functional.conv1d``."""
    return convolution(input, weight, bias, stride, padding, dilation, groups, 1)


def conv2d(input, weight, bias=None, stride=1, padding=0, dilation=1, groups=1):
    """2-D convolution over (N, C, H, W) or (C, H, W), as ``torch.nn.functional.conv2d``.

    ``padding`` is an int, a pair, or ``'valid'`` / ``'same'`` (stride 1 only).
    """
    return convolution(input, weight, bias, stride, padding, dilation, groups, 2)

"""2-D pooling (max, average, adaptive average) as one fused node each, as PyTorch's.

The 1-D forms in ``nn.functional`` run these on an unsqueezed input, as PyTorch
does. Each pools over the last two axes, whatever leads them, so batched and
unbatched inputs take the same path.

Every VJP here is linear in the incoming gradient and stays fused at any order:
max pooling scatters the gradient to the argmax positions (``xp.index_add``,
whose own VJP gathers); average pooling's VJP spreads it back over the windows,
a fused node whose VJP is average pooling again; adaptive average pooling is two
matmuls with constant averaging matrices.

>>> import distgrad
>>> x = distgrad.randn(1, 1, 4, 4)
>>> max_pool2d(x, 2).shape
distgrad.Size([1, 1, 2, 2])
"""
import itertools
import numbers

import numpy as np

from .conv import expand_param, pad_trailing, window_view
from .fused import call_fused, require_floating
from ..autograd._internal import array_of, wrap, defop, record

__all__ = ["max_pool1d", "max_pool2d", "max_pool1d_with_indices", "max_pool2d_with_indices",
           "avg_pool1d", "avg_pool2d", "adaptive_avg_pool1d",
           "adaptive_avg_pool2d", "pool_output_size"]


def pool_output_size(size, kernel, stride, pad, dilation, ceil_mode):
    """PyTorch's ``pooling_output_shape``: the last window starts inside the input or left pad."""
    out = (size + 2 * pad - dilation * (kernel - 1) - 1 + (stride - 1 if ceil_mode else 0)) \
        // stride + 1
    if ceil_mode and (out - 1) * stride >= size + pad:
        out -= 1
    return out


def _defaults_to_kernel(stride):
    """None, or PyTorch's internal empty list: the stride is the kernel size."""
    return stride is None or (not isinstance(stride, numbers.Integral) and len(stride) == 0)


def _pool_params(name, kernel_size, stride, padding, dilation):
    def pair(value, what):
        if isinstance(value, numbers.Integral):
            return (int(value),) * 2
        value = tuple(value)
        if len(value) == 1:
            return value * 2
        if len(value) != 2:
            raise RuntimeError(f"{name}: {what} must either be a single int, or a tuple of two "
                               "ints")
        return tuple(int(v) for v in value)

    kernel = pair(kernel_size, "kernel_size")
    stride = kernel if _defaults_to_kernel(stride) else pair(stride, "stride")
    padding = pair(padding, "padding")
    dilation = pair(dilation, "dilation")
    if any(s <= 0 for s in stride):
        raise RuntimeError("stride should not be zero")
    if any(k <= 0 for k in kernel):
        raise RuntimeError(f"kernel size should be greater than zero, but got kH: {kernel[0]} "
                           f"kW: {kernel[1]}")
    if any(dl <= 0 for dl in dilation):
        raise RuntimeError(f"dilation should be greater than zero, but got dilationH: "
                           f"{dilation[0]} dilationW: {dilation[1]}")
    return kernel, stride, padding, dilation


def _pool_geometry(input, kernel, stride, padding, dilation, ceil_mode):
    """Output size and the (before, after) padding that makes every window in range."""
    x = array_of(input)
    if x.ndim not in (3, 4):
        raise RuntimeError("non-empty 3D or 4D (batch mode) tensor expected for input")
    if 0 in x.shape[-3:]:
        raise RuntimeError("Expected 3D or 4D (batch mode) tensor with optional 0 dim batch size "
                           f"for input, but got:{list(x.shape)}")
    for p, k, dl in zip(padding, kernel, dilation):
        if p > (dl * (k - 1) + 1) // 2:
            raise RuntimeError(f"pad should be at most half of effective kernel size, but got "
                               f"pad={p}, kernel_size={k} and dilation={dl}")
    spatial = x.shape[-2:]
    out = tuple(pool_output_size(n, k, s, p, dl, ceil_mode)
                for n, k, s, p, dl in zip(spatial, kernel, stride, padding, dilation))
    if any(o < 1 for o in out):
        plane = "x".join(map(str, x.shape[-3:]))
        raise RuntimeError(f"Given input size: ({plane}). Calculated output size: "
                           f"({x.shape[-3]}x{out[0]}x{out[1]}). Output size is too small")
    # ceil_mode's last window may reach past the right padding: pad that far too.
    pads = tuple((p, max(0, (o - 1) * s + dl * (k - 1) + 1 - n - p))
                 for n, k, s, p, dl, o in zip(spatial, kernel, stride, padding, dilation, out))
    return out, pads


# ---------------------------------------------------------------- max pooling
def _max_pool_vjp(xp, g, m):
    flat = xp.index_add((m["numel"],), (m["flat_index"],), g, m["overlapping"])
    return xp.reshape(flat, m["input_shape"])


MaxPool2DWithIndicesBackward0 = defop("MaxPool2DWithIndicesBackward0", vjps=(_max_pool_vjp,))


def _window_max(padded, kernel, stride, padding, dilation, out, width):
    """Each window's maximum and its flat index in the (unpadded) input plane.

    One pass per kernel offset over strided views, no copy of the windows. Ties
    keep the first maximum and a NaN always wins, as PyTorch's ``val > max ||
    isnan(val)``.
    """
    win = window_view(padded, kernel, stride, dilation, out)  # (..., *out, *kernel)
    best = win[..., 0, 0].copy()
    which = np.zeros(best.shape, dtype=np.intp)  # the winning kernel offset, row-major
    taken = np.empty(best.shape, dtype=bool)
    for k, (i, j) in enumerate(itertools.product(range(kernel[0]), range(kernel[1]))):
        if k == 0:
            continue
        candidate = win[..., i, j]
        np.greater(candidate, best, out=taken)
        if best.dtype.kind == "f":
            taken |= np.isnan(candidate)
        np.putmask(which, taken, k)
        np.maximum(best, candidate, out=best)  # NaN propagates, as the index above says
    ki, kj = np.divmod(which, kernel[1])
    rows = np.arange(out[0])[:, None] * stride[0] - padding[0] + ki * dilation[0]
    cols = np.arange(out[1]) * stride[1] - padding[1] + kj * dilation[1]
    return best, rows * width + cols


def max_pool2d(input, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False,
               return_indices=False):
    """Max over 2-D windows; ``return_indices`` adds each maximum's flat index in its plane."""
    kernel, stride, padding, dilation = _pool_params("max_pool2d", kernel_size, stride, padding,
                                                     dilation)
    out, pads = _pool_geometry(input, kernel, stride, padding, dilation, ceil_mode)
    x = array_of(input)
    if x.dtype.kind == "f":
        low = -np.inf
    elif x.dtype.kind in "iu":
        low = np.iinfo(x.dtype).min
    else:
        require_floating("max_pool2d", input)
    values, index = _window_max(pad_trailing(x, pads, low), kernel, stride, padding, dilation, out,
                                x.shape[-1])
    plane = x.shape[-2] * x.shape[-1]
    meta = None
    if input.requires_grad:
        planes = np.arange(int(np.prod(x.shape[:-2], dtype=np.int64))).reshape(x.shape[:-2])
        meta = {"numel": x.size, "input_shape": x.shape,
                "flat_index": index + (planes * plane)[..., None, None],
                "overlapping": any(s < dl * (k - 1) + 1
                                   for k, s, dl in zip(kernel, stride, dilation)),
                "kernel_size": kernel, "stride": stride, "padding": padding,
                "dilation": dilation, "ceil_mode": ceil_mode}
    result = record(MaxPool2DWithIndicesBackward0, values, (input,), (), meta)
    if return_indices:
        return result, wrap(index.astype(np.int64, copy=False))
    return result


# ---------------------------------------------------------------- average pooling
def _avg_divisors(spatial, out, kernel, stride, padding, count_include_pad, divisor_override):
    """1 / divisor per output position: separable, a product of per-axis window counts."""
    if divisor_override is not None:
        return np.full(out, 1.0 / divisor_override)
    counts = []
    for n, o, k, s, p in zip(spatial, out, kernel, stride, padding):
        start = np.arange(o) * s - p
        end = np.minimum(start + k, n + p)
        counts.append(end - start if count_include_pad
                      else np.minimum(end, n) - np.maximum(start, 0))
    return 1.0 / np.multiply.outer(counts[0], counts[1])


def _avg_pool_np(x, m):
    win = window_view(pad_trailing(x, m["pads"]), m["kernel_size"], m["stride"], (1, 1), m["out"])
    return (win.sum(axis=(-2, -1)) * m["scale"]).astype(x.dtype, copy=False)


def _avg_pool_adjoint_np(g, m):
    """Spread each output's gradient evenly back over its window (the transpose of pooling)."""
    scaled = (g * m["scale"]).astype(g.dtype, copy=False)
    shape = m["input_shape"]
    pads, out, stride = m["pads"], m["out"], m["stride"]
    padded = tuple(n + lo + hi for n, (lo, hi) in zip(shape[-2:], pads))
    dx = np.zeros(shape[:-2] + padded, dtype=g.dtype)
    for i, j in itertools.product(*(range(k) for k in m["kernel_size"])):
        dx[..., i:i + (out[0] - 1) * stride[0] + 1:stride[0],
           j:j + (out[1] - 1) * stride[1] + 1:stride[1]] += scaled
    return dx[..., pads[0][0]:pads[0][0] + shape[-2], pads[1][0]:pads[1][0] + shape[-1]]


# Pooling is linear, so its VJP is its adjoint and the adjoint's VJP is pooling again.
def _avg_pool_vjp(xp, grads, m, needs, *saved):
    return (call_fused(xp, AvgPool2DAdjointBackward, _avg_pool_adjoint_np, grads[:1], m),)


def _avg_pool_adjoint_vjp(xp, grads, m, needs, *saved):
    return (call_fused(xp, AvgPool2DBackward0, _avg_pool_np, grads[:1], m),)


AvgPool2DBackward0 = defop("AvgPool2DBackward0", vjp_all=_avg_pool_vjp)
AvgPool2DAdjointBackward = defop("AvgPool2DBackwardBackward0", vjp_all=_avg_pool_adjoint_vjp)


def avg_pool2d(input, kernel_size, stride=None, padding=0, ceil_mode=False,
               count_include_pad=True, divisor_override=None):
    """Mean over 2-D windows, with PyTorch's divisor rules (padding counted or not, override)."""
    kernel, stride, padding, _ = _pool_params("avg_pool2d", kernel_size, stride, padding, 1)
    if divisor_override is not None and divisor_override == 0:
        raise RuntimeError("divisor must be not zero")
    out, pads = _pool_geometry(input, kernel, stride, padding, (1, 1), ceil_mode)
    require_floating("avg_pool2d", input)
    x = array_of(input)
    meta = {"kernel_size": kernel, "stride": stride, "padding": padding, "pads": pads,
            "out": out, "input_shape": x.shape, "ceil_mode": ceil_mode,
            "count_include_pad": count_include_pad, "divisor_override": divisor_override,
            "scale": _avg_divisors(x.shape[-2:], out, kernel, stride, padding,
                                   count_include_pad, divisor_override).astype(x.dtype)}
    return record(AvgPool2DBackward0, _avg_pool_np(x, meta), (input,), (), meta)


# ---------------------------------------------------------------- adaptive average pooling
def _averaging_matrix(n, o, dtype):
    """(o, n): row i averages input [floor(i*n/o), ceil((i+1)*n/o)), PyTorch's adaptive regions."""
    a = np.zeros((o, n), dtype=dtype)
    for i in range(o):
        start, end = (i * n) // o, -((-(i + 1) * n) // o)
        a[i, start:end] = 1.0 / (end - start)
    return a


def _adaptive_vjp(xp, g, m):
    rows, cols = m["matrices"]
    return xp.matmul(xp.matmul(rows.T, g), cols)


AdaptiveAvgPool2DBackward0 = defop("AdaptiveAvgPool2DBackward0", vjps=(_adaptive_vjp,))


def adaptive_avg_pool2d(input, output_size):
    """Average over the regions that split the input evenly into ``output_size`` (None: keep)."""
    x = array_of(input)
    if x.ndim not in (3, 4):
        raise RuntimeError(f"adaptive_avg_pool2d(): Expected 3D or 4D tensor, but got "
                           f"{list(x.shape)}")
    if isinstance(output_size, numbers.Integral) or output_size is None:
        output_size = (output_size, output_size)
    output_size = tuple(output_size)
    if len(output_size) != 2:
        raise RuntimeError("adaptive_avg_pool2d: output_size must be 2")
    out = tuple(n if o is None else int(o) for o, n in zip(output_size, x.shape[-2:]))
    if any(o < 0 for o in out):
        raise RuntimeError(f"adaptive_avg_pool2d: elements of output_size must be greater than or "
                           f"equal to 0 but received {{{out[0]}, {out[1]}}}")
    for dim in range(1, x.ndim - 2):
        if x.shape[dim] == 0:
            raise RuntimeError(f"adaptive_avg_pool2d(): Expected input to have non-zero size for "
                               f"non-batch dimensions, but input has sizes {list(x.shape)} with "
                               f"dimension {dim} being empty")
    require_floating("adaptive_avg_pool2d", input)
    rows = _averaging_matrix(x.shape[-2], out[0], x.dtype)
    cols = _averaging_matrix(x.shape[-1], out[1], x.dtype)
    y = np.matmul(np.matmul(rows, x), cols.T)
    return record(AdaptiveAvgPool2DBackward0, y, (input,), (),
                  {"matrices": (rows, cols), "output_size": out})


# ---------------------------------------------------------------- 1-D forms, on a (..., 1, L) view
def _check_1d_rank(input, name):
    if array_of(input).ndim not in (2, 3):
        raise RuntimeError(f"Expected 2 to 3 dimensions, but got {array_of(input).ndim}-dimensional "
                           f"tensor for argument #1 'self' (while checking arguments for {name})")


def _single(value, name, op):
    return expand_param(value, 1, name, op)[0]


def max_pool1d(input, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False,
               return_indices=False):
    """Max over 1-D windows of (N, C, L) or (C, L), as ``torch.nn.functional.max_pool1d``."""
    if array_of(input).ndim not in (2, 3):
        raise RuntimeError(f"max_pool1d: Expected 2D or 3D (batch mode) tensor with optional 0 dim "
                           f"batch size for input, but got:{list(array_of(input).shape)}")
    kernel = _single(kernel_size, "kernel_size", "max_pool1d")
    stride = kernel if _defaults_to_kernel(stride) else _single(stride, "stride", "max_pool1d")
    out = max_pool2d(input.unsqueeze(-2), (1, kernel), (1, stride),
                     (0, _single(padding, "padding", "max_pool1d")),
                     (1, _single(dilation, "dilation", "max_pool1d")), ceil_mode, return_indices)
    if return_indices:
        return out[0].squeeze(-2), out[1].squeeze(-2)
    return out.squeeze(-2)


def max_pool1d_with_indices(input, kernel_size, stride=None, padding=0, dilation=1,
                            ceil_mode=False, return_indices=False):
    """:func:`max_pool1d` that always returns ``(values, indices)``."""
    return max_pool1d(input, kernel_size, stride, padding, dilation, ceil_mode, True)


def max_pool2d_with_indices(input, kernel_size, stride=None, padding=0, dilation=1,
                            ceil_mode=False, return_indices=False):
    """:func:`max_pool2d` that always returns ``(values, indices)``."""
    return max_pool2d(input, kernel_size, stride, padding, dilation, ceil_mode, True)


def avg_pool1d(input, kernel_size, stride=None, padding=0, ceil_mode=False,
               count_include_pad=True):
    """Mean over 1-D windows of (N, C, L) or (C, L), as ``torch.nn.functional.avg_pool1d``."""
    _check_1d_rank(input, "avg_pool1d")
    kernel = _single(kernel_size, "kernel_size", "avg_pool1d")
    stride = kernel if _defaults_to_kernel(stride) else _single(stride, "stride", "avg_pool1d")
    return avg_pool2d(input.unsqueeze(-2), (1, kernel), (1, stride),
                      (0, _single(padding, "padding", "avg_pool1d")), ceil_mode,
                      count_include_pad).squeeze(-2)


def adaptive_avg_pool1d(input, output_size):
    """Average over ``output_size`` even regions of the last axis of (N, C, L) or (C, L)."""
    _check_1d_rank(input, "adaptive_avg_pool1d")
    size = _single(output_size, "output_size", "adaptive_avg_pool1d")
    return adaptive_avg_pool2d(input.unsqueeze(-2), (1, size)).squeeze(-2)

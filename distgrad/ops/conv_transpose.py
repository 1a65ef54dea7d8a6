"""Transposed convolution (``conv_transpose1d``, ``conv_transpose2d``), as PyTorch's.

A transposed convolution is the adjoint of a convolution: for the convolution that
maps the transposed one's output back to its input (same weight, stride, padding,
dilation and groups), ``conv_transpose(z, w)`` is that convolution's input gradient
for the output gradient ``z``. So it reuses the fused convolution kernels of
``ops/conv.py``: the forward is the input-gradient map (col2im), the gradient of
``z`` is the convolution of the output gradient, the gradient of ``w`` the weight
map; gradients of gradients stay fused too. The node is ``ConvolutionBackward0``,
as in PyTorch. The weight is ``(in_channels, out_channels / groups, *kernel)``.

>>> import distgrad
>>> x = distgrad.ones(1, 1, 2, 2)
>>> conv_transpose2d(x, distgrad.ones(1, 1, 2, 2), stride=2).shape
distgrad.Size([1, 1, 4, 4])
"""
import numpy as np

from . import np_backend
from .conv import (check_operands, convolution_map, expand_param, expand_positive,
                   input_grad_map, weight_grad_map)
from ..autograd._internal import array_of, defop, record

__all__ = ["conv_transpose1d", "conv_transpose2d", "conv_transpose"]


def _conv_transpose_vjp(xp, grads, m, needs, z, w):
    g = grads[0]  # shaped like the transposed convolution's output
    reached = g if m["unreached"] is None else g[m["unreached"]]  # the rest: bias only
    return (convolution_map(xp, reached, w, m) if needs[0] else None,
            weight_grad_map(xp, reached, z, m) if needs[1] else None,
            xp.sum(g, axis=(0,) + tuple(range(2, g.ndim))) if needs[2] else None)


ConvolutionBackward0 = defop("ConvolutionBackward0", saved=("input", "weight"),
                             vjp_all=_conv_transpose_vjp)


def conv_transpose(input, weight, bias, stride, padding, output_padding, groups, dilation, d):
    """The d-dimensional transposed convolution of batched or unbatched ``input``."""
    name = f"conv_transpose{d}d"
    x, w = check_operands(name, input, weight, bias, d, "in_channels, out_channels/groups")
    if isinstance(padding, str):
        raise TypeError(f"{name}(): argument 'padding' must be a tuple of ints, not str")
    stride = expand_positive(stride, d, "stride")
    padding = expand_param(padding, d, "padding")
    output_padding = expand_param(output_padding, d, "output_padding")
    dilation = expand_positive(dilation, d, "dilation")
    if groups <= 0:
        raise RuntimeError("non-positive groups is not supported")
    if any(p < 0 for p in padding) or any(p < 0 for p in output_padding):
        raise RuntimeError("negative padding is not supported")
    if any(op >= s and op >= dl for op, s, dl in zip(output_padding, stride, dilation)):
        raise RuntimeError(f"output padding must be smaller than either stride or dilation, but "
                           f"got output_padding={list(output_padding)}, stride={list(stride)}, "
                           f"dilation={list(dilation)}")
    unbatched = x.ndim == d + 1
    if unbatched:
        input = input.unsqueeze(0)
        x = array_of(input)
    if w.shape[0] % groups:
        raise RuntimeError(f"Given groups={groups}, expected weight to be divisible by {groups} at "
                           f"dimension 0, but got weight of size {list(w.shape)} instead")
    if x.shape[1] != w.shape[0]:
        raise RuntimeError(f"Given transposed=1, weight of size {list(w.shape)}, expected "
                           f"input{list(x.shape)} to have {w.shape[0]} channels, but got "
                           f"{x.shape[1]} channels instead")
    out_channels = w.shape[1] * groups
    if bias is not None and array_of(bias).shape != (out_channels,):
        raise RuntimeError(f"Given transposed=1, weight of size {list(w.shape)}, expected bias "
                           f"to be 1-dimensional with {out_channels} elements, but got bias of "
                           f"size {list(array_of(bias).shape)} instead")
    kernel = w.shape[2:]
    out = tuple((n - 1) * s - 2 * p + dl * (k - 1) + op + 1 for n, s, p, dl, k, op in
                zip(x.shape[2:], stride, padding, dilation, kernel, output_padding))
    if any(o <= 0 for o in out):
        raise RuntimeError(f"Given input size per channel: ({' x '.join(map(str, x.shape[2:]))})"
                           f". Calculated output size per channel: "
                           f"({' x '.join(map(str, out))}). Output size is too small")
    # The convolution this one is the adjoint of: its input is our output, padded by
    # `padding` before and `padding - output_padding` after. Where output_padding is
    # larger, the last `extra` positions of the output are reached by no input (they
    # get the bias only): that convolution's input stops before them.
    extra = tuple(max(op - p, 0) for op, p in zip(output_padding, padding))
    reached = tuple(o - e for o, e in zip(out, extra))
    meta = {"stride": stride, "dilation": dilation, "groups": groups,
            "padding": tuple((p, max(p - op, 0)) for p, op in zip(padding, output_padding)),
            "input_shape": (x.shape[0], out_channels) + reached, "weight_shape": w.shape,
            "unreached": (Ellipsis,) + tuple(slice(0, r) for r in reached) if any(extra)
            else None}
    y = input_grad_map(np_backend, x, w, meta)
    if any(extra):
        y = np.pad(y, ((0, 0), (0, 0)) + tuple((0, e) for e in extra))
    if bias is not None:
        y = y + array_of(bias).reshape((-1,) + (1,) * d)
    result = record(ConvolutionBackward0, y, (input, weight, bias), (input, weight), meta)
    return result.squeeze(0) if unbatched else result


def conv_transpose1d(input, weight, bias=None, stride=1, padding=0, output_padding=0, groups=1,
                     dilation=1):
    """1-D transposed convolution over (N, C, L) or (C, L), as
    ``torch.nn.functional.conv_transpose1d``."""
    return conv_transpose(input, weight, bias, stride, padding, output_padding, groups,
                          dilation, 1)


def conv_transpose2d(input, weight, bias=None, stride=1, padding=0, output_padding=0, groups=1,
                     dilation=1):
    """2-D transposed convolution over (N, C, H, W) or (C, H, W), as
    ``torch.nn.functional.conv_transpose2d``."""
    return conv_transpose(input, weight, bias, stride, padding, output_padding, groups,
                          dilation, 2)

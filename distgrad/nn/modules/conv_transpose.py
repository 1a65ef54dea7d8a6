"""``ConvTranspose1d`` and ``ConvTranspose2d``, as ``torch.nn``.

The weight is ``(in_channels, out_channels / groups, *kernel_size)`` and starts as
PyTorch's (kaiming uniform with a=sqrt(5) over that shape's fan-in, which for this
layout counts ``out_channels / groups``). ``forward(input, output_size=None)``: an
``output_size`` picks the ``output_padding`` that gives it, as PyTorch does; only
``padding_mode='zeros'`` exists for transposed convolutions.

>>> import distgrad
>>> up = ConvTranspose2d(16, 8, 3, stride=2, padding=1)
>>> up(distgrad.randn(1, 16, 12, 12), output_size=[1, 8, 24, 24]).shape
distgrad.Size([1, 8, 24, 24])
"""
from ...ops.conv import expand_param
from .. import functional as F
from .conv import _ConvNd

__all__ = ["ConvTranspose1d", "ConvTranspose2d"]


class _ConvTransposeNd(_ConvNd):
    _dims = 0
    _functional = None

    def __init__(self, in_channels, out_channels, kernel_size, stride=1, padding=0,
                 output_padding=0, groups=1, bias=True, dilation=1, padding_mode="zeros",
                 device=None, dtype=None):
        d = self._dims
        if padding_mode != "zeros":
            raise ValueError(f'Only "zeros" padding mode is supported for {type(self).__name__}')
        super().__init__(in_channels, out_channels, expand_param(kernel_size, d, "kernel_size"),
                         expand_param(stride, d, "stride"), expand_param(padding, d, "padding"),
                         expand_param(dilation, d, "dilation"), True,
                         expand_param(output_padding, d, "output_padding"), groups, bias,
                         padding_mode, device, dtype)

    def _output_padding(self, input, output_size):
        """``self.output_padding``, or the one that makes the output ``output_size``."""
        if output_size is None:
            return self.output_padding
        d = self._dims
        batched = input.dim() == d + 2
        leading = 2 if batched else 1
        output_size = list(output_size)
        if len(output_size) == leading + d:
            output_size = output_size[leading:]
        if len(output_size) != d:
            raise ValueError(f"ConvTranspose{d}D: for {input.dim()}D input, output_size must "
                             f"have {d} or {leading + d} elements (got {len(output_size)})")
        min_sizes = [(input.shape[i + leading] - 1) * self.stride[i] - 2 * self.padding[i]
                     + self.dilation[i] * (self.kernel_size[i] - 1) + 1 for i in range(d)]
        max_sizes = [m + s - 1 for m, s in zip(min_sizes, self.stride)]
        for size, low, high in zip(output_size, min_sizes, max_sizes):
            if size < low or size > high:
                raise ValueError(f"requested an output size of {output_size}, but valid sizes "
                                 f"range from {min_sizes} to {max_sizes} (for an input of "
                                 f"{list(input.shape[leading:])})")
        return tuple(size - low for size, low in zip(output_size, min_sizes))

    def forward(self, input, output_size=None):
        output_padding = self._output_padding(input, output_size)
        return self._functional(input, self.weight, self.bias, self.stride, self.padding,
                                output_padding, self.groups, self.dilation)


class ConvTranspose1d(_ConvTransposeNd):
    """1-D transposed convolution over (N, C_in, L) or (C_in, L)."""

    _dims = 1
    _functional = staticmethod(F.conv_transpose1d)


class ConvTranspose2d(_ConvTransposeNd):
    """2-D transposed convolution over (N, C_in, H, W) or (C_in, H, W)."""

    _dims = 2
    _functional = staticmethod(F.conv_transpose2d)

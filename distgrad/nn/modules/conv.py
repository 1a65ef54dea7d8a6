"""``Conv1d`` and ``Conv2d``, as ``torch.nn`` (``ConvTranspose*d``: ``conv_transpose.py``).

Weight (out_channels, in_channels / groups, *kernel_size) and bias start as
PyTorch's (kaiming uniform with a=sqrt(5); bias uniform in +-1/sqrt(fan_in)).
``padding_mode`` other than ``'zeros'`` pads with ``F.pad`` first, as PyTorch does.
"""
from ...ops.creation import empty
from ...ops.conv import expand_param
from .. import functional as F
from ..parameter import Parameter
from .linear import reset_affine_parameters
from .module import Module

__all__ = ["Conv1d", "Conv2d"]

class _ConvNd(Module):
    __constants__ = ["stride", "padding", "dilation", "groups", "padding_mode", "output_padding",
                     "in_channels", "out_channels", "kernel_size"]

    def __init__(self, in_channels, out_channels, kernel_size, stride, padding, dilation,
                 transposed, output_padding, groups, bias, padding_mode, device=None, dtype=None):
        super().__init__()
        if groups <= 0:
            raise ValueError("groups must be a positive integer")
        if in_channels % groups != 0:
            raise ValueError("in_channels must be divisible by groups")
        if out_channels % groups != 0:
            raise ValueError("out_channels must be divisible by groups")
        valid_padding_strings = {"same", "valid"}
        if isinstance(padding, str):
            if padding not in valid_padding_strings:
                raise ValueError(f"Invalid padding string {padding!r}, should be one of "
                                 f"{valid_padding_strings}")
            if padding == "same" and any(s != 1 for s in stride):
                raise ValueError("padding='same' is not supported for strided convolutions")
        valid_padding_modes = {"zeros", "reflect", "replicate", "circular"}
        if padding_mode not in valid_padding_modes:
            raise ValueError(f"padding_mode must be one of {valid_padding_modes}, but got "
                             f"padding_mode='{padding_mode}'")
        self.in_channels = in_channels
        self.out_channels = out_channels
        self.kernel_size = kernel_size
        self.stride = stride
        self.padding = padding
        self.dilation = dilation
        self.transposed = transposed
        self.output_padding = output_padding
        self.groups = groups
        self.padding_mode = padding_mode
        # F.pad's order (last axis first), as PyTorch keeps it for non-zero padding modes.
        self._reversed_padding_repeated_twice = [0, 0] * len(kernel_size)
        for i, (k, dl) in enumerate(zip(reversed(kernel_size), reversed(dilation))):
            if padding == "same":
                total = dl * (k - 1)
                before, after = total // 2, total - total // 2
            elif padding == "valid":
                before = after = 0
            else:
                before = after = padding[len(kernel_size) - 1 - i]
            self._reversed_padding_repeated_twice[2 * i:2 * i + 2] = [before, after]
        if not isinstance(padding, str):  # PyTorch keeps a tuple here, a list for the strings
            self._reversed_padding_repeated_twice = tuple(self._reversed_padding_repeated_twice)
        # a transposed convolution's weight is (in, out / groups, *kernel), as PyTorch's
        channels = (in_channels, out_channels // groups) if transposed else \
            (out_channels, in_channels // groups)
        self.weight = Parameter(empty(*channels, *kernel_size, dtype=dtype))
        if bias:
            self.bias = Parameter(empty(out_channels, dtype=dtype))
        else:
            self.register_parameter("bias", None)
        self.reset_parameters()

    def reset_parameters(self):
        reset_affine_parameters(self.weight, self.bias)

    def extra_repr(self):
        s = "{in_channels}, {out_channels}, kernel_size={kernel_size}, stride={stride}"
        if self.padding != (0,) * len(self.padding):
            s += ", padding={padding}"
        if self.dilation != (1,) * len(self.dilation):
            s += ", dilation={dilation}"
        if self.output_padding != (0,) * len(self.output_padding):
            s += ", output_padding={output_padding}"
        if self.groups != 1:
            s += ", groups={groups}"
        if self.bias is None:
            s += ", bias=False"
        if self.padding_mode != "zeros":
            s += ", padding_mode={padding_mode}"
        return s.format(**self.__dict__)

    def _conv_forward(self, input, weight, bias):
        if self.padding_mode != "zeros":
            input = F.pad(input, self._reversed_padding_repeated_twice, mode=self.padding_mode)
            padding = 0
        else:
            padding = self.padding
        return self._functional(input, weight, bias, self.stride, padding, self.dilation,
                                self.groups)

    def forward(self, input):
        return self._conv_forward(input, self.weight, self.bias)


def _expand(value, n, name):
    return value if isinstance(value, str) else expand_param(value, n, name)


class Conv1d(_ConvNd):
    """1-D convolution over (N, C_in, L) or (C_in, L)."""

    _functional = staticmethod(F.conv1d)

    def __init__(self, in_channels, out_channels, kernel_size, stride=1, padding=0, dilation=1,
                 groups=1, bias=True, padding_mode="zeros", device=None, dtype=None):
        super().__init__(in_channels, out_channels, expand_param(kernel_size, 1, "kernel_size"),
                         expand_param(stride, 1, "stride"), _expand(padding, 1, "padding"),
                         expand_param(dilation, 1, "dilation"), False, (0,), groups, bias,
                         padding_mode, device, dtype)


class Conv2d(_ConvNd):
    """2-D convolution over (N, C_in, H, W) or (C_in, H, W).

    >>> import distgrad
    >>> conv = Conv2d(1, 6, 5)
    >>> conv(distgrad.randn(64, 1, 32, 32)).shape
    distgrad.Size([64, 6, 28, 28])
    """

    _functional = staticmethod(F.conv2d)

    def __init__(self, in_channels, out_channels, kernel_size, stride=1, padding=0, dilation=1,
                 groups=1, bias=True, padding_mode="zeros", device=None, dtype=None):
        super().__init__(in_channels, out_channels, expand_param(kernel_size, 2, "kernel_size"),
                         expand_param(stride, 2, "stride"), _expand(padding, 2, "padding"),
                         expand_param(dilation, 2, "dilation"), False, (0, 0), groups, bias,
                         padding_mode, device, dtype)

"""``Linear`` and ``Identity``, as ``torch.nn``."""
import math

from ...ops.creation import empty
from ...ops.linalg import linear as _linear
from .. import init
from ..parameter import Parameter
from .module import Module

__all__ = ["Identity", "Linear", "reset_affine_parameters"]


def reset_affine_parameters(weight, bias):
    """PyTorch's default start of Linear and Conv layers: weight kaiming uniform (a=sqrt(5)),
    bias uniform in +-1/sqrt(fan_in); both bounds come out as 1/sqrt(fan_in)."""
    init.kaiming_uniform_(weight, a=math.sqrt(5))
    if bias is not None:
        fan_in, _ = init._calculate_fan_in_and_fan_out(weight)
        bound = 1 / math.sqrt(fan_in) if fan_in > 0 else 0
        init.uniform_(bias, -bound, bound)


class Identity(Module):
    def __init__(self, *args, **kwargs):
        super().__init__()

    def forward(self, input):
        return input


class Linear(Module):
    """``y = x W^T + b``; weight and bias start as PyTorch's (kaiming uniform, a=sqrt(5))."""

    def __init__(self, in_features, out_features, bias=True, device=None, dtype=None):
        super().__init__()
        self.in_features = in_features
        self.out_features = out_features
        self.weight = Parameter(empty(out_features, in_features, dtype=dtype))
        if bias:
            self.bias = Parameter(empty(out_features, dtype=dtype))
        else:
            self.register_parameter("bias", None)
        self.reset_parameters()

    def reset_parameters(self):
        reset_affine_parameters(self.weight, self.bias)

    def forward(self, input):
        params = self._parameters  # one dict read instead of two Module.__getattr__ calls
        return _linear(input, params["weight"], params["bias"])

    def extra_repr(self):
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"bias={self.bias is not None}")

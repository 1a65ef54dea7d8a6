"""``distgrad.autograd``: the local engine, with ``torch.autograd``'s API."""
from .deferred_weight_grads import defer_weight_grads
from .engine import backward, grad
from .function import Function, FunctionCtx, once_differentiable
from .grad_mode import (enable_grad, inference_mode, is_grad_enabled, is_inference_mode_enabled,
                        no_grad, set_grad_enabled)
from .gradcheck import GradcheckError, gradcheck, gradgradcheck
from .tensor import TensorBase
from . import graph, profiler, profiler_util, tensor as _tensor
from .profiler_util import DeviceType

Variable = TensorBase  # the legacy name, kept for programs that still use it: Variable(t) and
# isinstance(t, Variable) work as PyTorch's (TensorBase(...) builds a distgrad.Tensor)


def __getattr__(name):
    # distgrad.autograd.Tensor, as before distgrad.Tensor was assembled above this package
    if name == "Tensor":
        return _tensor.Tensor
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

__all__ = ["backward", "grad", "Function", "FunctionCtx", "once_differentiable", "enable_grad",
           "inference_mode", "is_grad_enabled", "is_inference_mode_enabled", "no_grad",
           "set_grad_enabled", "gradcheck", "gradgradcheck", "GradcheckError", "graph", "Variable",
           "profiler", "DeviceType",
           "defer_weight_grads"]  # distgrad's own: pipelines' split backward

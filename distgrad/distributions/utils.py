"""Helpers shared by the distributions, as ``torch.distributions.utils``."""
import numbers
from functools import update_wrapper

import numpy as np

from .. import nn
from ..autograd import dtype as _dt
from ..autograd.grad_mode import enable_grad
from ..autograd.tensor import Size
from .._tensor import Tensor
from ..ops.creation import tensor as _tensor
from ..autograd._internal import array_of

__all__ = ["broadcast_all", "clamp_probs", "lazy_property", "logits_to_probs",
           "probs_to_logits"]

euler_constant = 0.57721566490153286060


def broadcast_all(*values):
    """Numbers and tensors broadcast to one shape; numbers become tensors of the first
    tensor's dtype (or the default dtype). The results are views: gradients flow back."""
    if not all(isinstance(v, (Tensor, numbers.Number)) for v in values):
        raise ValueError("Input arguments must all be instances of Number, torch.Tensor or "
                         "objects implementing __torch_function__.")
    like = next((v for v in values if isinstance(v, Tensor)), None)
    dtype = like.dtype if like is not None else _dt.get_default_dtype()
    tensors = [v if isinstance(v, Tensor) else _tensor(v, dtype=dtype) for v in values]
    return broadcast_tensors(*tensors)


def batch_shape_of(param, *given):
    """A distribution's batch shape: none when every parameter was given as a number."""
    return Size() if all(isinstance(v, numbers.Number) for v in given) else param.size()


def broadcast_tensors(*tensors):
    shape = Size(np.broadcast_shapes(*(array_of(t).shape for t in tensors)))
    return tuple(t if array_of(t).shape == shape else t.expand(shape) for t in tensors)


def logits_to_probs(logits, is_binary=False):
    if is_binary:
        return logits.sigmoid()
    return nn.functional.softmax(logits, dim=-1)


def clamp_probs(probs):
    """Probabilities kept off 0 and 1 by the dtype's epsilon, so their logits are finite."""
    eps = float(np.finfo(array_of(probs).dtype).eps)
    return probs.clamp(min=eps, max=1 - eps)


def probs_to_logits(probs, is_binary=False):
    ps_clamped = clamp_probs(probs)
    if is_binary:
        return ps_clamped.log() - (-ps_clamped).log1p()
    return ps_clamped.log()


class lazy_property:
    """Computed on first access (with gradients enabled) and then stored on the instance,
    so ``Bernoulli(logits=...)`` computes ``probs`` only when asked."""

    def __init__(self, wrapped):
        self.wrapped = wrapped
        update_wrapper(self, wrapped)

    def __get__(self, instance, obj_type=None):
        if instance is None:
            return self
        with enable_grad():
            value = self.wrapped(instance)
        setattr(instance, self.wrapped.__name__, value)
        return value

"""Gradient clipping, as ``torch.nn.utils.clip_grad``."""
import numpy as np

from ...autograd.grad_mode import no_grad
from ..._tensor import Tensor
from ...autograd._internal import array_of, wrap

__all__ = ["clip_grad_norm_", "clip_grad_value_"]


def _grads(parameters):
    if isinstance(parameters, Tensor):
        parameters = [parameters]
    return [p.grad for p in parameters if p.grad is not None]


def clip_grad_norm_(parameters, max_norm, norm_type=2.0, error_if_nonfinite=False, foreach=None):
    """Scale the gradients in place so their joint norm is at most ``max_norm``; returns the norm.

    >>> import distgrad
    >>> p = distgrad.nn.Parameter(distgrad.zeros(2)); p.grad = distgrad.tensor([3.0, 4.0])
    >>> clip_grad_norm_([p], 1.0).item(), [round(v, 3) for v in p.grad.tolist()]
    (5.0, [0.6, 0.8])
    """
    grads = _grads(parameters)
    max_norm = float(max_norm)
    norm_type = float(norm_type)
    if not grads:
        return wrap(np.array(0.0, dtype=np.float32))
    if norm_type == float("inf"):
        norms = [np.abs(array_of(g)).max() if array_of(g).size else np.float64(0) for g in grads]
        total = max(norms)
    else:
        total = sum(float(np.sum(np.abs(array_of(g).astype(np.float64)) ** norm_type))
                    for g in grads) ** (1.0 / norm_type)
    total_norm = wrap(np.array(total, dtype=array_of(grads[0]).dtype))
    if error_if_nonfinite and not np.isfinite(total):
        raise RuntimeError(f"The total norm of order {norm_type} for gradients from `parameters` "
                           "is non-finite, so it cannot be clipped. To disable this error and "
                           "scale the gradients by the non-finite norm anyway, set "
                           "`error_if_nonfinite=False`")
    clip_coef = max_norm / (float(total_norm.item()) + 1e-6)
    clip_coef_clamped = min(clip_coef, 1.0)
    with no_grad():
        for g in grads:
            g.mul_(clip_coef_clamped)
    return total_norm


def clip_grad_value_(parameters, clip_value, foreach=None):
    clip_value = float(clip_value)
    with no_grad():
        for g in _grads(parameters):
            g.clamp_(min=-clip_value, max=clip_value)

"""``Adam``, as ``torch.optim.Adam`` (and the shared core of ``AdamW``, ``NAdam``, ``RAdam``)."""
import numpy as np

from .optimizer import (Optimizer, _advance_step, _apply_weight_decay, _check_betas,
                        _check_nonnegative, _init_step_and_buffers, _lerp_, _zeros_state)
from ..autograd._internal import array_of

__all__ = ["Adam"]


def _init_moments(p, state):
    _init_step_and_buffers(p, state, "exp_avg", "exp_avg_sq")


def _update_moments(p, grad, state, group, scratch=None):
    """Weight decay (L2, or decoupled when the group says so), then one more step of the
    first and second moment estimates (intermediates in ``scratch``, shaped like ``p``,
    when given). Returns the step number and the decayed gradient."""
    grad = _apply_weight_decay(array_of(p), grad, group["weight_decay"], group["lr"],
                               group.get("decoupled_weight_decay", False))
    beta1, beta2 = group["betas"]
    step = _advance_step(state)
    exp_avg, exp_avg_sq = array_of(state["exp_avg"]), array_of(state["exp_avg_sq"])
    _lerp_(exp_avg, grad, 1 - beta1, scratch)
    exp_avg_sq *= beta2
    term = np.multiply(grad, 1 - beta2, out=scratch)  # addcmul's value * grad * grad
    term *= grad
    exp_avg_sq += term
    return step, grad


class Adam(Optimizer):
    """Adam (``amsgrad`` optional); ``decoupled_weight_decay=True`` gives AdamW's rule."""

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0,
                 amsgrad=False, *, foreach=None, maximize=False, capturable=False,
                 differentiable=False, fused=None, decoupled_weight_decay=False):
        _check_nonnegative(lr=lr, eps=eps)
        _check_betas(betas)
        _check_nonnegative(weight_decay=weight_decay)
        defaults = dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, amsgrad=amsgrad,
                        maximize=maximize, foreach=foreach, capturable=capturable,
                        differentiable=differentiable, fused=fused,
                        decoupled_weight_decay=decoupled_weight_decay)
        super().__init__(params, defaults)

    def _init_state(self, p, state, group):
        _init_moments(p, state)
        if group["amsgrad"]:
            state["max_exp_avg_sq"] = _zeros_state(p)

    def _update(self, p, grad, state, group):
        scratch = self._scratch(array_of(p))
        step, _ = _update_moments(p, grad, state, group, scratch)
        beta1, beta2 = group["betas"]
        bias_correction1 = 1 - beta1 ** step
        bias_correction2_sqrt = (1 - beta2 ** step) ** 0.5
        second = array_of(state["exp_avg_sq"])
        if group["amsgrad"]:
            second = np.maximum(array_of(state["max_exp_avg_sq"]), second,
                                out=array_of(state["max_exp_avg_sq"]))
        # param.addcdiv_(exp_avg, sqrt(second) / bias_correction2_sqrt + eps, -step_size)
        update = np.sqrt(second, out=scratch)
        update /= bias_correction2_sqrt
        update += group["eps"]
        np.divide(array_of(state["exp_avg"]), update, out=update)
        update *= group["lr"] / bias_correction1
        array_of(p)[...] -= update

"""``Adamax``: Adam with the infinity norm, as ``torch.optim.Adamax``."""
import numpy as np

from .optimizer import (Optimizer, _advance_step, _apply_weight_decay, _check_betas,
                        _check_nonnegative, _init_step_and_buffers, _lerp_)
from ..autograd._internal import array_of

__all__ = ["Adamax"]


class Adamax(Optimizer):
    def __init__(self, params, lr=2e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0,
                 foreach=None, *, maximize=False, differentiable=False, capturable=False):
        _check_nonnegative(lr=lr, eps=eps)
        _check_betas(betas)
        _check_nonnegative(weight_decay=weight_decay)
        defaults = dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, foreach=foreach,
                        maximize=maximize, differentiable=differentiable, capturable=capturable)
        super().__init__(params, defaults)

    def _init_state(self, p, state, group):
        _init_step_and_buffers(p, state, "exp_avg", "exp_inf")

    def _update(self, p, grad, state, group):
        param = array_of(p)
        scratch = self._scratch(param)
        beta1, beta2 = group["betas"]
        step = _advance_step(state)
        grad = _apply_weight_decay(param, grad, group["weight_decay"])
        exp_avg, exp_inf = array_of(state["exp_avg"]), array_of(state["exp_inf"])
        _lerp_(exp_avg, grad, 1 - beta1, scratch)
        exp_inf *= beta2
        bound = np.abs(grad, out=scratch)
        bound += group["eps"]
        np.maximum(exp_inf, bound, out=exp_inf)
        # param.addcdiv_(exp_avg, exp_inf, value=-lr / bias_correction)
        update = np.divide(exp_avg, exp_inf, out=scratch)
        update *= group["lr"] / (1 - beta1 ** step)
        param -= update

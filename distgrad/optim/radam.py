"""``RAdam``: Adam with a rectified adaptive learning rate, as ``torch.optim.RAdam``."""
import numpy as np

from .adam import _init_moments, _update_moments
from .optimizer import Optimizer, _check_betas, _check_nonnegative
from ..autograd._internal import array_of

__all__ = ["RAdam"]


class RAdam(Optimizer):
    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0,
                 decoupled_weight_decay=False, *, foreach=None, maximize=False,
                 capturable=False, differentiable=False):
        _check_nonnegative(lr=lr, eps=eps)
        _check_betas(betas)
        _check_nonnegative(weight_decay=weight_decay)
        defaults = dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay,
                        maximize=maximize, foreach=foreach, capturable=capturable,
                        decoupled_weight_decay=decoupled_weight_decay,
                        differentiable=differentiable)
        super().__init__(params, defaults)

    def _init_state(self, p, state, group):
        _init_moments(p, state)

    def _update(self, p, grad, state, group):
        step, _ = _update_moments(p, grad, state, group)
        param, lr = array_of(p), group["lr"]
        beta1, beta2 = group["betas"]
        bias_correction2 = 1 - beta2 ** step
        bias_corrected_exp_avg = array_of(state["exp_avg"]) / (1 - beta1 ** step)
        rho_inf = 2 / (1 - beta2) - 1
        rho_t = rho_inf - 2 * step * (beta2 ** step) / bias_correction2
        if rho_t > 5.0:
            # The variance of the adaptive rate is tractable: rectify it.
            rect = ((rho_t - 4) * (rho_t - 2) * rho_inf
                    / ((rho_inf - 4) * (rho_inf - 2) * rho_t)) ** 0.5
            adaptive_lr = bias_correction2 ** 0.5 / (np.sqrt(array_of(state["exp_avg_sq"]))
                                                     + group["eps"])
            param -= bias_corrected_exp_avg * lr * adaptive_lr * rect
        else:
            param -= bias_corrected_exp_avg * lr

"""``NAdam``: Adam with Nesterov momentum and momentum decay, as ``torch.optim.NAdam``."""
import numpy as np

from .adam import _init_moments, _update_moments
from .optimizer import Optimizer, _check_betas, _check_nonnegative
from ..autograd._internal import array_of, wrap, set_array

__all__ = ["NAdam"]


class NAdam(Optimizer):
    def __init__(self, params, lr=2e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0,
                 momentum_decay=4e-3, decoupled_weight_decay=False, *, foreach=None,
                 maximize=False, capturable=False, differentiable=False):
        _check_nonnegative(lr=lr, eps=eps)
        _check_betas(betas)
        _check_nonnegative(weight_decay=weight_decay, momentum_decay=momentum_decay)
        defaults = dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay,
                        momentum_decay=momentum_decay,
                        decoupled_weight_decay=decoupled_weight_decay, maximize=maximize,
                        foreach=foreach, capturable=capturable, differentiable=differentiable)
        super().__init__(params, defaults)

    def _init_state(self, p, state, group):
        _init_moments(p, state)
        # The running product of the momentum schedule, a float32 scalar as in PyTorch.
        state["mu_product"] = wrap(np.array(1.0, dtype=np.float32))

    def _update(self, p, grad, state, group):
        param, lr = array_of(p), group["lr"]
        beta1, beta2 = group["betas"]
        step, grad = _update_moments(p, grad, state, group)
        momentum_decay = group["momentum_decay"]
        mu = beta1 * (1.0 - 0.5 * (0.96 ** (step * momentum_decay)))
        mu_next = beta1 * (1.0 - 0.5 * (0.96 ** ((step + 1) * momentum_decay)))
        mu_t = state["mu_product"]
        set_array(mu_t, np.asarray(array_of(mu_t) * mu, dtype=np.float32))
        mu_product = float(array_of(mu_t))
        denom = np.sqrt(array_of(state["exp_avg_sq"]) / (1 - beta2 ** step)) + group["eps"]
        param += (-lr * (1.0 - mu) / (1.0 - mu_product)) * grad / denom
        param += (-lr * mu_next) / (1.0 - mu_product * mu_next) * array_of(state["exp_avg"]) / denom

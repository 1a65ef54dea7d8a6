"""``Adadelta``, as ``torch.optim.Adadelta``."""
import numpy as np

from .optimizer import (Optimizer, _advance_step, _apply_weight_decay, _check_nonnegative,
                        _init_step_and_buffers)
from ..autograd._internal import array_of

__all__ = ["Adadelta"]


class Adadelta(Optimizer):
    def __init__(self, params, lr=1.0, rho=0.9, eps=1e-6, weight_decay=0, foreach=None, *,
                 capturable=False, maximize=False, differentiable=False):
        _check_nonnegative(lr=lr)
        if not 0.0 <= rho <= 1.0:
            raise ValueError(f"Invalid rho value: {rho}")
        _check_nonnegative(eps=eps, weight_decay=weight_decay)
        defaults = dict(lr=lr, rho=rho, eps=eps, weight_decay=weight_decay, maximize=maximize,
                        capturable=capturable, foreach=foreach, differentiable=differentiable)
        super().__init__(params, defaults)

    def _init_state(self, p, state, group):
        _init_step_and_buffers(p, state, "square_avg", "acc_delta")

    def _update(self, p, grad, state, group):
        param, rho, eps = array_of(p), group["rho"], group["eps"]
        _advance_step(state)
        grad = _apply_weight_decay(param, grad, group["weight_decay"])
        square_avg, acc_delta = array_of(state["square_avg"]), array_of(state["acc_delta"])
        square_avg *= rho
        square_avg += (1 - rho) * grad * grad
        delta = np.sqrt(acc_delta + eps) / np.sqrt(square_avg + eps) * grad
        acc_delta *= rho
        acc_delta += (1 - rho) * delta * delta
        param -= group["lr"] * delta

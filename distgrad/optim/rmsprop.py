"""``RMSprop`` (centered and with momentum optional), as ``torch.optim.RMSprop``."""
import numpy as np

from .optimizer import (Optimizer, _advance_step, _apply_weight_decay, _check_nonnegative,
                        _init_step_and_buffers, _lerp_)
from ..autograd._internal import array_of

__all__ = ["RMSprop"]


class RMSprop(Optimizer):
    def __init__(self, params, lr=1e-2, alpha=0.99, eps=1e-8, weight_decay=0, momentum=0,
                 centered=False, capturable=False, foreach=None, maximize=False,
                 differentiable=False):
        _check_nonnegative(lr=lr, eps=eps, momentum=momentum, weight_decay=weight_decay,
                           alpha=alpha)
        defaults = dict(lr=lr, momentum=momentum, alpha=alpha, eps=eps, centered=centered,
                        weight_decay=weight_decay, capturable=capturable, foreach=foreach,
                        maximize=maximize, differentiable=differentiable)
        super().__init__(params, defaults)

    def _init_state(self, p, state, group):
        _init_step_and_buffers(p, state, "square_avg",
                               *(["momentum_buffer"] if group["momentum"] > 0 else []),
                               *(["grad_avg"] if group["centered"] else []))

    def _update(self, p, grad, state, group):
        param, alpha = array_of(p), group["alpha"]
        scratch = self._scratch(param)
        _advance_step(state)
        grad = _apply_weight_decay(param, grad, group["weight_decay"])
        square_avg = array_of(state["square_avg"])
        square_avg *= alpha
        term = np.multiply(grad, 1 - alpha, out=scratch)  # addcmul's value * grad * grad
        term *= grad
        square_avg += term
        if group["centered"]:
            grad_avg = array_of(state["grad_avg"])
            _lerp_(grad_avg, grad, 1 - alpha, scratch)
            avg = np.multiply(grad_avg, grad_avg, out=scratch)
            np.subtract(square_avg, avg, out=avg)
            np.sqrt(avg, out=avg)
        else:
            avg = np.sqrt(square_avg, out=scratch)
        avg += group["eps"]
        step = np.divide(grad, avg, out=avg)  # grad / avg: avg is not needed after this
        if group["momentum"] > 0:
            buf = array_of(state["momentum_buffer"])
            buf *= group["momentum"]
            buf += step
            step = np.multiply(buf, group["lr"], out=scratch)
        else:
            step *= group["lr"]
        param -= step

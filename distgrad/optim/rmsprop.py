"""``RMSprop`` (centered and with momentum optional), as ``torch.optim.RMSprop``."""
import numpy as np

from .optimizer import (Optimizer, _advance_step, _apply_weight_decay, _check_nonnegative,
                        _init_step_and_buffers, _lerp_)

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
        param, alpha = p._data, group["alpha"]
        _advance_step(state)
        grad = _apply_weight_decay(param, grad, group["weight_decay"])
        square_avg = state["square_avg"]._data
        square_avg *= alpha
        square_avg += (1 - alpha) * grad * grad
        if group["centered"]:
            grad_avg = state["grad_avg"]._data
            _lerp_(grad_avg, grad, 1 - alpha)
            avg = np.sqrt(square_avg - grad_avg * grad_avg)
        else:
            avg = np.sqrt(square_avg)
        avg += group["eps"]
        if group["momentum"] > 0:
            buf = state["momentum_buffer"]._data
            buf *= group["momentum"]
            buf += grad / avg
            param -= group["lr"] * buf
        else:
            param -= group["lr"] * grad / avg

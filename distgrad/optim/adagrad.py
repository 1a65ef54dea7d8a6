"""``Adagrad``, as ``torch.optim.Adagrad``."""
import numpy as np

from .optimizer import (Optimizer, _advance_step, _apply_weight_decay, _check_nonnegative,
                        _step_tensor)
from ..autograd._internal import array_of, wrap

__all__ = ["Adagrad"]


class Adagrad(Optimizer):
    _accepts_sparse_gradients = True

    def __init__(self, params, lr=1e-2, lr_decay=0, weight_decay=0, initial_accumulator_value=0,
                 eps=1e-10, foreach=None, *, maximize=False, differentiable=False, fused=None):
        _check_nonnegative(lr=lr, lr_decay=lr_decay, weight_decay=weight_decay,
                           initial_accumulator_value=initial_accumulator_value, eps=eps)
        defaults = dict(lr=lr, lr_decay=lr_decay, eps=eps, weight_decay=weight_decay,
                        initial_accumulator_value=initial_accumulator_value, foreach=foreach,
                        maximize=maximize, differentiable=differentiable, fused=fused)
        super().__init__(params, defaults)
        # PyTorch creates Adagrad's state up front (a state dict has it before any step).
        for group in self.param_groups:
            for p in group["params"]:
                self._init_state(p, self.state[p], group)

    def _init_state(self, p, state, group):
        state["step"] = _step_tensor()
        state["sum"] = wrap(np.full_like(array_of(p), self.defaults["initial_accumulator_value"]))

    def _update(self, p, grad, state, group):
        param = array_of(p)
        step = _advance_step(state)
        grad = _apply_weight_decay(param, grad, group["weight_decay"])
        clr = group["lr"] / (1 + (step - 1) * group["lr_decay"])
        state_sum = array_of(state["sum"])
        state_sum += grad * grad
        param -= clr * grad / (np.sqrt(state_sum) + group["eps"])

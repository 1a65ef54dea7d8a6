"""``Adam``, as ``torch.optim.Adam`` (and the shared core of ``AdamW``)."""
import numpy as np

from .optimizer import Optimizer, _step_tensor, _zeros_state

__all__ = ["Adam"]


class Adam(Optimizer):
    """Adam (``amsgrad`` optional); ``decoupled_weight_decay=True`` gives AdamW's rule."""

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0,
                 amsgrad=False, *, foreach=None, maximize=False, capturable=False,
                 differentiable=False, fused=None, decoupled_weight_decay=False):
        if not 0.0 <= lr:
            raise ValueError(f"Invalid learning rate: {lr}")
        if not 0.0 <= eps:
            raise ValueError(f"Invalid epsilon value: {eps}")
        if not 0.0 <= betas[0] < 1.0:
            raise ValueError(f"Invalid beta parameter at index 0: {betas[0]}")
        if not 0.0 <= betas[1] < 1.0:
            raise ValueError(f"Invalid beta parameter at index 1: {betas[1]}")
        if not 0.0 <= weight_decay:
            raise ValueError(f"Invalid weight_decay value: {weight_decay}")
        defaults = dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, amsgrad=amsgrad,
                        maximize=maximize, foreach=foreach, capturable=capturable,
                        differentiable=differentiable, fused=fused,
                        decoupled_weight_decay=decoupled_weight_decay)
        super().__init__(params, defaults)

    def _init_state(self, p, state, group):
        state["step"] = _step_tensor()
        state["exp_avg"] = _zeros_state(p)
        state["exp_avg_sq"] = _zeros_state(p)
        if group["amsgrad"]:
            state["max_exp_avg_sq"] = _zeros_state(p)

    def _update(self, p, grad, state, group):
        param = p._data
        beta1, beta2 = group["betas"]
        lr, weight_decay = group["lr"], group["weight_decay"]
        step_t = state["step"]
        step_t._data = step_t._data + np.float32(1)
        step = float(step_t._data)
        if weight_decay != 0:
            if group.get("decoupled_weight_decay"):
                param *= 1 - lr * weight_decay
            else:
                grad = grad + weight_decay * param
        exp_avg, exp_avg_sq = state["exp_avg"]._data, state["exp_avg_sq"]._data
        exp_avg += (grad - exp_avg) * (1 - beta1)  # lerp_, as PyTorch writes it
        exp_avg_sq *= beta2
        exp_avg_sq += (1 - beta2) * grad * grad
        bias_correction1 = 1 - beta1 ** step
        bias_correction2_sqrt = (1 - beta2 ** step) ** 0.5
        step_size = lr / bias_correction1
        if group["amsgrad"]:
            max_sq = state["max_exp_avg_sq"]._data
            np.maximum(max_sq, exp_avg_sq, out=max_sq)
            denom = np.sqrt(max_sq) / bias_correction2_sqrt + group["eps"]
        else:
            denom = np.sqrt(exp_avg_sq) / bias_correction2_sqrt + group["eps"]
        param -= step_size * (exp_avg / denom)

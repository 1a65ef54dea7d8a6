"""``SGD`` with momentum, dampening, Nesterov and weight decay, as ``torch.optim.SGD``."""
import numpy as np

from .optimizer import Optimizer, required
from ..autograd._internal import array_of, wrap

__all__ = ["SGD"]


class SGD(Optimizer):
    """``torch.optim.SGD``'s update rule, on NumPy buffers.

    >>> import distgrad
    >>> p = distgrad.nn.Parameter(distgrad.ones(2)); p.grad = distgrad.ones(2)
    >>> SGD([p], lr=0.5).step(); p.tolist()
    [0.5, 0.5]
    """

    _accepts_sparse_gradients = True

    def __init__(self, params, lr=1e-3, momentum=0, dampening=0, weight_decay=0, nesterov=False,
                 *, maximize=False, foreach=None, differentiable=False, fused=None):
        if lr is not required and lr < 0.0:
            raise ValueError(f"Invalid learning rate: {lr}")
        if momentum < 0.0:
            raise ValueError(f"Invalid momentum value: {momentum}")
        if weight_decay < 0.0:
            raise ValueError(f"Invalid weight_decay value: {weight_decay}")
        defaults = dict(lr=lr, momentum=momentum, dampening=dampening, weight_decay=weight_decay,
                        nesterov=nesterov, maximize=maximize, foreach=foreach,
                        differentiable=differentiable, fused=fused)
        if nesterov and (momentum <= 0 or dampening != 0):
            raise ValueError("Nesterov momentum requires a momentum and zero dampening")
        super().__init__(params, defaults)

    def _init_state(self, p, state, group):
        if group["momentum"] != 0:
            state["momentum_buffer"] = None

    def _updates_sparse(self, group):
        return group["momentum"] == 0  # a momentum buffer is dense: it gets the dense form

    def _update(self, p, grad, state, group):
        weight_decay, momentum = group["weight_decay"], group["momentum"]
        param = array_of(p)
        if type(grad) is not np.ndarray:  # sparse: only the rows it has move
            np.subtract.at(param, tuple(grad.indices), group["lr"] * grad.values)
            return
        scratch = self._scratch(param)
        if weight_decay != 0:
            grad = grad + weight_decay * param
        if momentum != 0:
            buf = state.get("momentum_buffer")
            if buf is None:
                buf = state["momentum_buffer"] = wrap(grad.copy())
            else:
                b = array_of(buf)
                b *= momentum
                b += np.multiply(grad, 1 - group["dampening"], out=scratch)
            if group["nesterov"]:
                grad = grad + momentum * array_of(buf)
            else:
                grad = array_of(buf)
        param -= np.multiply(grad, group["lr"], out=scratch)

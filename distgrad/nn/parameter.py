"""``Parameter``: a leaf tensor that a Module registers, as ``torch.nn.Parameter``."""
from ..autograd.tensor import Tensor, _make

__all__ = ["Parameter", "zero_grads"]


class Parameter(Tensor):
    """A Tensor that requires grad by default and that ``Module.__setattr__`` registers.

    >>> import distgrad
    >>> p = Parameter(distgrad.zeros(2))
    >>> p.requires_grad, p.is_leaf
    (True, True)
    """

    def __new__(cls, data=None, requires_grad=True):
        if data is None:
            from .. import empty
            data = empty(0)
        # Shares the buffer of `data`, as PyTorch does (`Parameter(t)` aliases `t`).
        p = _make(data._data, vc=data._vc, cls=cls)
        p._requires_grad = bool(requires_grad)
        return p

    def __init__(self, data=None, requires_grad=True):
        pass

    def __repr__(self):
        return "Parameter containing:\n" + super().__repr__()

    def __reduce_ex__(self, protocol):
        return (_rebuild_parameter, (self._data.copy(), self._requires_grad))


def _rebuild_parameter(data, requires_grad):
    return Parameter(_make(data), requires_grad)



def zero_grads(params, set_to_none=True):
    """``Module.zero_grad`` and ``Optimizer.zero_grad``: drop or zero each ``.grad``."""
    for p in params:
        g = p._grad
        if g is None:
            continue
        if set_to_none:
            p._grad = None
        else:
            if g._grad_fn is not None:
                g.detach_()
            else:
                g.requires_grad_(False)
            g.zero_()

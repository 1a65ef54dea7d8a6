"""``Parameter``: a leaf tensor that a Module registers, as ``torch.nn.Parameter``."""
from .._tensor import Tensor
from ..autograd._internal import array_of, wrap, version_counter, mark_requires_grad
from ..ops.creation import empty
from .._tensor_str import prints_as_tensor

__all__ = ["Parameter", "zero_grads"]


@prints_as_tensor
class Parameter(Tensor):
    """A Tensor that requires grad by default and that ``Module.__setattr__`` registers.

    >>> import distgrad
    >>> p = Parameter(distgrad.zeros(2))
    >>> p.requires_grad, p.is_leaf
    (True, True)
    """

    def __new__(cls, data=None, requires_grad=True):
        if data is None:
            data = empty(0)
        # Shares the buffer of `data`, as PyTorch does (`Parameter(t)` aliases `t`).
        p = wrap(array_of(data), vc=version_counter(data), cls=cls)
        mark_requires_grad(p, bool(requires_grad))
        return p

    def __init__(self, data=None, requires_grad=True):
        pass

    def __repr__(self):
        return "Parameter containing:\n" + super().__repr__()

    def __reduce_ex__(self, protocol):
        return (_rebuild_parameter, (array_of(self).copy(), self.requires_grad))


def _rebuild_parameter(data, requires_grad):
    return Parameter(wrap(data), requires_grad)



def zero_grads(params, set_to_none=True):
    """``Module.zero_grad`` and ``Optimizer.zero_grad``: drop or zero each ``.grad``."""
    for p in params:
        g = p.grad
        if g is None:
            continue
        if set_to_none:
            p.grad = None
        else:
            if g.grad_fn is not None:
                g.detach_()
            else:
                g.requires_grad_(False)
            g.zero_()

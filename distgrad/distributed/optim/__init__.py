"""``torch.distributed.optim`` for distgrad: :class:`DistributedOptimizer`."""
from .optimizer import DistributedOptimizer

__all__ = ["DistributedOptimizer"]

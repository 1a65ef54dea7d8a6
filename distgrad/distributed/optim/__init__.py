"""``torch.distributed.optim`` for distgrad: :class:`DistributedOptimizer`, and (a distgrad
extension, for checkpoints) :func:`local_optimizer`, its local part on a parameter owner."""
from .optimizer import DistributedOptimizer, local_optimizer

__all__ = ["DistributedOptimizer", "local_optimizer"]

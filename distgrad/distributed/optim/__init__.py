"""``torch.distributed.optim`` for distgrad: :class:`DistributedOptimizer`, and (distgrad
extensions) :func:`local_optimizer`, its local part on a parameter owner (for checkpoints),
and :func:`step_local`, which steps that part alone."""
from .optimizer import DistributedOptimizer, local_optimizer, step_local

__all__ = ["DistributedOptimizer", "local_optimizer", "step_local"]

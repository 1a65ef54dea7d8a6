"""``distgrad.nn.parallel``: ``DistributedDataParallel`` (it loads ``distgrad.distributed``
only when a model is wrapped)."""
from .distributed import DistributedDataParallel

__all__ = ["DistributedDataParallel"]

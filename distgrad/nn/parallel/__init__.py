"""``distgrad.nn.parallel``: ``DistributedDataParallel`` (the type; ``distgrad.distributed``
implements it) and ``DataParallel`` (the module as it is, on CPU)."""
from .data_parallel import DataParallel, data_parallel
from .distributed import DistributedDataParallel

__all__ = ["DistributedDataParallel", "DataParallel", "data_parallel"]

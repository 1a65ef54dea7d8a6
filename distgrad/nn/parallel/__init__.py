"""``distgrad.nn.parallel``: ``DistributedDataParallel`` (it loads ``distgrad.distributed``
only when a model is wrapped) and ``DataParallel`` (the module as it is, on CPU)."""
from .data_parallel import DataParallel, data_parallel
from .distributed import DistributedDataParallel

__all__ = ["DistributedDataParallel", "DataParallel", "data_parallel"]

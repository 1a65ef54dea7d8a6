"""``DistributedSampler``: each replica's share of a dataset, in PyTorch's order.

>>> from distgrad.utils.data import DistributedSampler
>>> [list(DistributedSampler(range(10), num_replicas=3, rank=r, shuffle=False))
...  for r in range(3)]
[[0, 3, 6, 9], [1, 4, 7, 0], [2, 5, 8, 1]]
"""
import math

from .sampler import Sampler
from .torch_order import torch_randperm

__all__ = ["DistributedSampler", "use_default_group"]


# The default process group's getters, {"rank": get_rank, "world_size": get_world_size}:
# installed by distgrad.distributed when it is imported (this layer is below it).
_default_group_getters = {}


def use_default_group(get_rank, get_world_size):
    """Where a sampler given no ``rank``/``num_replicas`` asks (``distgrad.distributed``)."""
    _default_group_getters.update(rank=get_rank, world_size=get_world_size)


def _default_group(what):
    """The world size or rank of the default process group, as PyTorch's sampler asks it."""
    getter = _default_group_getters.get(what)
    if getter is None:  # distgrad.distributed was never imported: no group can exist
        raise ValueError("Default process group has not been initialized, please make sure to "
                         "call init_process_group.")
    return getter()


class DistributedSampler(Sampler):
    """The indices of ``dataset`` that replica ``rank`` of ``num_replicas`` loads.

    With ``shuffle`` the order is ``torch.randperm`` seeded with ``seed + epoch``
    (exactly PyTorch's indices; call :meth:`set_epoch` before each epoch). Without
    ``drop_last`` the tail wraps around so every replica gets the same count;
    with it the tail is dropped.
    """

    def __init__(self, dataset, num_replicas=None, rank=None, shuffle=True, seed=0,
                 drop_last=False):
        if num_replicas is None:
            num_replicas = _default_group("world_size")
        if rank is None:
            rank = _default_group("rank")
        if rank >= num_replicas or rank < 0:
            raise ValueError(f"Invalid rank {rank}, rank should be in the interval "
                             f"[0, {num_replicas - 1}]")
        self.dataset = dataset
        self.num_replicas = num_replicas
        self.rank = rank
        self.epoch = 0
        self.drop_last = drop_last
        if self.drop_last and len(self.dataset) % self.num_replicas != 0:
            self.num_samples = math.ceil((len(self.dataset) - self.num_replicas)
                                         / self.num_replicas)
        else:
            self.num_samples = math.ceil(len(self.dataset) / self.num_replicas)
        self.total_size = self.num_samples * self.num_replicas
        self.shuffle = shuffle
        self.seed = seed

    def __iter__(self):
        if self.shuffle:
            indices = torch_randperm(len(self.dataset), self.seed + self.epoch)
        else:
            indices = list(range(len(self.dataset)))
        if not self.drop_last:
            padding_size = self.total_size - len(indices)
            if padding_size <= len(indices):
                indices += indices[:padding_size]
            else:
                indices += (indices * math.ceil(padding_size / len(indices)))[:padding_size]
        else:
            indices = indices[:self.total_size]
        return iter(indices[self.rank:self.total_size:self.num_replicas])

    def __len__(self):
        return self.num_samples

    def set_epoch(self, epoch):
        """Shuffle differently in the next epoch (all replicas must pass the same epoch)."""
        self.epoch = epoch

"""``distgrad.utils.data``: datasets, samplers and the DataLoader, with ``torch.utils.data``'s names.

>>> import distgrad
>>> from distgrad.utils.data import DataLoader, TensorDataset
>>> loader = DataLoader(TensorDataset(distgrad.arange(8.0)), batch_size=4)
>>> [batch.tolist() for (batch,) in loader]
[[0.0, 1.0, 2.0, 3.0], [4.0, 5.0, 6.0, 7.0]]
"""
from .collate import default_collate, default_convert
from .dataloader import DataLoader
from .dataset import (ChainDataset, ConcatDataset, Dataset, IterableDataset, StackDataset,
                      Subset, TensorDataset, random_split)
from .distributed import DistributedSampler
from .sampler import (BatchSampler, RandomSampler, Sampler, SequentialSampler,
                      SubsetRandomSampler, WeightedRandomSampler)
from .worker import WorkerInfo, get_worker_info

__all__ = ["BatchSampler", "ChainDataset", "ConcatDataset", "DataLoader", "Dataset",
           "DistributedSampler", "IterableDataset", "RandomSampler", "Sampler",
           "SequentialSampler", "StackDataset", "Subset", "SubsetRandomSampler", "TensorDataset",
           "WeightedRandomSampler", "WorkerInfo", "default_collate", "default_convert",
           "get_worker_info", "random_split"]

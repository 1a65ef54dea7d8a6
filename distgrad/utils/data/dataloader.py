"""``DataLoader``: batches from a dataset, in this process or in worker processes.

The arguments, defaults, checks and errors are ``torch.utils.data.DataLoader``'s.
With ``num_workers > 0`` the batches are made by that many worker processes
(see below for how they start):
each gets its copy of the dataset when it starts, batch ``k`` is made by
worker ``k % num_workers`` (among those still running), at most
``prefetch_factor`` batches per worker are in flight, and batches are
delivered in order (``in_order=False``: as they come). Batches come back
through :mod:`distgrad.codec`, never unpickled (see :mod:`.channel` for what a
batch may hold).

Failures: an exception in a worker is raised again in the parent with the
worker's traceback (the iterator can go on, as in PyTorch); a worker that dies
raises ``RuntimeError: DataLoader worker (pid(s) ...) exited unexpectedly``
instead of hanging; ``timeout`` bounds each wait for a batch. Workers are
stopped and reaped when the iterator is exhausted (unless
``persistent_workers``), deleted or garbage collected, and they die with the
parent process.

Workers start as PyTorch's do, with the default start method (``fork`` on
Linux), so a script without an ``if __name__ == "__main__":`` guard works; but
never by forking a process that runs other threads or holds a ZeroMQ context:
then they are spawned (see :mod:`distgrad.utils.start_method`), and a
spawned worker imports the main script again, which then needs the guard (as
PyTorch needs on macOS and Windows). ``multiprocessing_context`` chooses.
Indices reach a worker on a pipe the parent writes without a helper thread
(so that the next loader may still fork), never more than the pipe holds
while the worker may be busy writing a batch.

>>> import distgrad
>>> from distgrad.utils.data import DataLoader, TensorDataset
>>> ds = TensorDataset(distgrad.arange(6.0).reshape(3, 2), distgrad.tensor([0, 1, 0]))
>>> [y.tolist() for _, y in DataLoader(ds, batch_size=2)]
[[0, 1], [0]]
"""
import math
import multiprocessing
import os
import warnings

from .collate import default_collate, default_convert
from .dataloader_iter import _MultiProcessingDataLoaderIter, _SingleProcessDataLoaderIter
from .dataset import IterableDataset
from .fetch import ITERABLE, MAP
from .sampler import BatchSampler, RandomSampler, Sampler, SequentialSampler

__all__ = ["DataLoader"]


class _InfiniteConstantSampler(Sampler):
    """The sampler of an IterableDataset: the dataset decides what comes next."""

    def __iter__(self):
        while True:
            yield None


class DataLoader:
    """Iterate over ``dataset`` in batches.

    Arguments as in PyTorch: ``batch_size=1``, ``shuffle`` (with ``generator``),
    ``sampler``, ``batch_sampler``, ``num_workers=0``, ``collate_fn``,
    ``pin_memory`` (accepted; there is no device memory to pin), ``drop_last``,
    ``timeout`` (seconds, 0 = wait as long as workers live), ``worker_init_fn``,
    ``multiprocessing_context``, and keyword-only ``prefetch_factor`` (2 with
    workers), ``persistent_workers``, ``pin_memory_device``, ``in_order``.
    """

    def __init__(self, dataset, batch_size=1, shuffle=None, sampler=None, batch_sampler=None,
                 num_workers=0, collate_fn=None, pin_memory=False, drop_last=False, timeout=0,
                 worker_init_fn=None, multiprocessing_context=None, generator=None, *,
                 prefetch_factor=None, persistent_workers=False, pin_memory_device="",
                 in_order=True):
        if num_workers < 0:
            raise ValueError("num_workers option should be non-negative; use num_workers=0 to "
                             "disable multiprocessing.")
        if timeout < 0:
            raise ValueError("timeout option should be non-negative")
        if num_workers == 0 and prefetch_factor is not None:
            raise ValueError("prefetch_factor option could only be specified in multiprocessing."
                             "let num_workers > 0 to enable multiprocessing, otherwise set "
                             "prefetch_factor to None.")
        if num_workers > 0 and prefetch_factor is None:
            prefetch_factor = 2
        elif prefetch_factor is not None and prefetch_factor < 0:
            raise ValueError("prefetch_factor option should be non-negative")
        if persistent_workers and num_workers == 0:
            raise ValueError("persistent_workers option needs num_workers > 0")

        self.dataset = dataset
        self.num_workers = num_workers
        self.prefetch_factor = prefetch_factor
        self.pin_memory = pin_memory
        self.pin_memory_device = pin_memory_device
        self.timeout = timeout
        self.worker_init_fn = worker_init_fn
        self.multiprocessing_context = multiprocessing_context
        self.in_order = in_order

        if isinstance(dataset, IterableDataset):
            self._dataset_kind = ITERABLE
            if shuffle not in {False, None}:
                raise ValueError("DataLoader with IterableDataset: expected unspecified shuffle "
                                 f"option, but got shuffle={shuffle}")
            if sampler is not None:
                raise ValueError("DataLoader with IterableDataset: expected unspecified sampler "
                                 f"option, but got sampler={sampler}")
            if batch_sampler is not None:
                raise ValueError("DataLoader with IterableDataset: expected unspecified "
                                 f"batch_sampler option, but got batch_sampler={batch_sampler}")
        else:
            shuffle = bool(shuffle)
            self._dataset_kind = MAP

        if sampler is not None and shuffle:
            raise ValueError("sampler option is mutually exclusive with shuffle")
        if batch_sampler is not None:
            if batch_size != 1 or shuffle or sampler is not None or drop_last:
                raise ValueError("batch_sampler option is mutually exclusive with batch_size, "
                                 "shuffle, sampler, and drop_last")
            batch_size = None
            drop_last = False
        elif batch_size is None and drop_last:
            raise ValueError("batch_size=None option disables auto-batching and is mutually "
                             "exclusive with drop_last")

        if sampler is None:
            if self._dataset_kind == ITERABLE:
                sampler = _InfiniteConstantSampler()
            elif shuffle:
                sampler = RandomSampler(dataset, generator=generator)
            else:
                sampler = SequentialSampler(dataset)
        if batch_size is not None and batch_sampler is None:
            batch_sampler = BatchSampler(sampler, batch_size, drop_last)

        self.batch_size = batch_size
        self.drop_last = drop_last
        self.sampler = sampler
        self.batch_sampler = batch_sampler
        self.generator = generator
        if collate_fn is None:
            collate_fn = default_collate if self._auto_collation else default_convert
        self.collate_fn = collate_fn
        self.persistent_workers = persistent_workers
        self._IterableDataset_len_called = None
        self._iterator = None
        self.__initialized = True
        self.check_worker_number_rationality()

    _DataLoader__initialized = False

    def __setattr__(self, attr, val):
        if self.__initialized and attr in ("batch_size", "batch_sampler", "sampler", "drop_last",
                                           "dataset", "persistent_workers"):
            raise ValueError(f"{attr} attribute should not be set after "
                             f"{self.__class__.__name__} is initialized")
        super().__setattr__(attr, val)

    @property
    def multiprocessing_context(self):
        return self.__multiprocessing_context

    @multiprocessing_context.setter
    def multiprocessing_context(self, context):
        if context is not None:
            if self.num_workers == 0:
                raise ValueError("multiprocessing_context can only be used with multi-process "
                                 f"loading (num_workers > 0), but got num_workers={self.num_workers}")
            if isinstance(context, str):
                valid = multiprocessing.get_all_start_methods()
                if context not in valid:
                    raise ValueError("multiprocessing_context option should specify a valid start "
                                     f"method in {valid!r}, but got "
                                     f"multiprocessing_context={context!r}")
                context = multiprocessing.get_context(context)
            if not isinstance(context, multiprocessing.context.BaseContext):
                raise TypeError("multiprocessing_context option should be a valid context object "
                                "or a string specifying the start method, but got "
                                f"multiprocessing_context={context}")
        self.__multiprocessing_context = context

    @property
    def _auto_collation(self):
        return self.batch_sampler is not None

    @property
    def _index_sampler(self):
        return self.batch_sampler if self._auto_collation else self.sampler

    def _get_iterator(self):
        if self.num_workers == 0:
            return _SingleProcessDataLoaderIter(self)
        self.check_worker_number_rationality()
        return _MultiProcessingDataLoaderIter(self)

    def __iter__(self):
        # Persistent workers serve every epoch of this loader from one iterator.
        if self.persistent_workers and self.num_workers > 0:
            if self._iterator is None or self._iterator._shutdown:
                self._iterator = self._get_iterator()
            else:
                self._iterator._reset(self)
            return self._iterator
        return self._get_iterator()

    def __len__(self):
        if self._dataset_kind == ITERABLE:
            length = self._IterableDataset_len_called = len(self.dataset)
            if self.batch_size is not None:
                length = (length // self.batch_size if self.drop_last
                          else math.ceil(length / self.batch_size))
            return length
        return len(self._index_sampler)

    def check_worker_number_rationality(self):
        """Warn when there are more workers than CPUs this process may use."""
        if not self.num_workers:
            return
        cpuset_checked = hasattr(os, "sched_getaffinity")
        max_workers = len(os.sched_getaffinity(0)) if cpuset_checked else os.cpu_count()
        if max_workers is None or self.num_workers > max_workers:
            suggestion = ("DataLoader is not able to compute a suggested max number of worker in "
                          "current system." if max_workers is None else
                          f"Our suggested max number of worker in current system is {max_workers}"
                          f"{'' if cpuset_checked else ' (`cpuset` is not taken into account)'}, "
                          "which is smaller than what this DataLoader is going to create.")
            warnings.warn(f"This DataLoader will create {self.num_workers} worker processes in "
                          f"total. {suggestion} Please be aware that excessive worker creation "
                          "might get DataLoader running slow or even freeze, lower the worker "
                          "number to avoid potential slowness/freeze if necessary.", stacklevel=2)

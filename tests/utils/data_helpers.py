"""Datasets and functions that DataLoader worker processes import by name in the tests."""
import collections
import os
import signal
import time

import numpy as np

import distgrad
from distgrad.utils.data import Dataset, IterableDataset, get_worker_info

Pair = collections.namedtuple("Pair", ["x", "y"])


class Squares(Dataset):
    """Sample i: (a float32 tensor [i, i*i], the int i); optionally as dicts or Pairs."""

    def __init__(self, n, form="tuple"):
        self.n, self.form = n, form

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        x = distgrad.tensor([float(i), float(i * i)])
        if self.form == "dict":
            return {"x": x, "y": i, "name": f"s{i}", "arr": np.full(3, i, dtype=np.int32)}
        if self.form == "pair":
            return Pair(x, i)
        return x, i


class Failing(Squares):
    """Raises ValueError at index ``bad``."""

    def __init__(self, n, bad):
        super().__init__(n)
        self.bad = bad

    def __getitem__(self, i):
        if i == self.bad:
            raise ValueError(f"sample {i} is broken")
        return super().__getitem__(i)


class Killing(Squares):
    """The worker that loads index ``bad`` records its pid in ``path`` and SIGKILLs itself."""

    def __init__(self, n, bad, path):
        super().__init__(n)
        self.bad, self.path = bad, path

    def __getitem__(self, i):
        if i == self.bad:
            with open(self.path, "w") as fh:
                fh.write(str(os.getpid()))
            os.kill(os.getpid(), signal.SIGKILL)
        return super().__getitem__(i)


class Slow(Squares):
    def __getitem__(self, i):
        time.sleep(5)
        return super().__getitem__(i)


class Troubled(Squares):
    """Samples as Pairs; index ``bad`` raises KeyError, index ``unsendable`` gives an object
    the codec cannot carry."""

    def __init__(self, n, bad, unsendable):
        super().__init__(n, "pair")
        self.bad, self.unsendable = bad, unsendable

    def __getitem__(self, i):
        if i == self.bad:
            raise KeyError(f"no sample {i}")
        if i == self.unsendable:
            return object()
        return super().__getitem__(i)


class Range(IterableDataset):
    """``range(start, end)``, split between the workers as in PyTorch's documentation; in a
    worker each sample is [value, worker id, num_workers, worker seed, pid, tag], where the
    tag is what ``tag_worker`` set on this worker's copy of the dataset."""

    def __init__(self, start, end):
        self.start, self.end = start, end

    def __iter__(self):
        info = get_worker_info()
        if info is None:
            return iter(range(self.start, self.end))
        per_worker = -(-(self.end - self.start) // info.num_workers)
        lo = self.start + info.id * per_worker
        facts = [info.id, info.num_workers, info.seed, os.getpid(), getattr(self, "tag", -1)]
        return iter([v] + facts for v in range(lo, min(lo + per_worker, self.end)))


def as_list(batch):
    return batch


def tag_worker(worker_id):
    get_worker_info().dataset.tag = 100 + worker_id


class TorchSquares:
    """Squares(n, "pair") with PyTorch tensors, for the oracle (imports torch when used)."""

    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        import torch
        return Pair(torch.tensor([float(i), float(i * i)]), i)


class Ints(Dataset):
    """Sample i is the int i, so that batches collate the same in distgrad and PyTorch. Options:
    ``log``, a file each worker appends "index worker-id" to as it fetches (the order of the
    lines of one worker is its order of work); ``slow``, indices that take ``delay`` seconds;
    ``bad``, an index that raises ValueError; ``gate``, a path: the ``slow`` indices wait
    until it exists (up to 60 s) instead of sleeping."""

    def __init__(self, n, log=None, slow=(), delay=1.0, bad=None, worker_info=None, gate=None):
        self.n, self.log, self.slow, self.delay, self.bad = n, log, set(slow), delay, bad
        self.gate = gate
        self.worker_info = worker_info  # the get_worker_info of the library under test

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        if self.log is not None:
            info = self.worker_info() if self.worker_info else get_worker_info()
            with open(self.log, "a") as fh:
                fh.write(f"{i} {info.id if info else -1}\n")
        if i in self.slow and self.gate is None:
            time.sleep(self.delay)
        end = time.monotonic() + 60
        while i in self.slow and self.gate and not os.path.exists(self.gate) \
                and time.monotonic() < end:
            time.sleep(0.01)
        if i == self.bad:
            raise ValueError(f"sample {i} is broken")
        return i


def torch_worker_info():
    import torch.utils.data
    return torch.utils.data.get_worker_info()


class Shards(IterableDataset):
    """Worker k of n yields ``sizes[k]`` values k*100, k*100+1, ... (the main process: all of
    them, worker after worker), so that shards of unequal length end at different times.
    ``worker_info`` as in Ints; ``torch_base`` makes it a torch IterableDataset."""

    def __init__(self, sizes, worker_info=None):
        self.sizes, self.worker_info = list(sizes), worker_info

    def __iter__(self):
        info = self.worker_info() if self.worker_info else get_worker_info()
        ids = range(len(self.sizes)) if info is None else [info.id]
        return iter([k * 100 + j for k in ids for j in range(self.sizes[k])])


def torch_shards(sizes):
    """Shards on PyTorch's IterableDataset (PyTorch's DataLoader checks the base class)."""
    import torch.utils.data

    class TorchShards(Shards, torch.utils.data.IterableDataset):
        pass
    TorchShards.__qualname__ = TorchShards.__name__ = "TorchShards"
    globals()["TorchShards"] = TorchShards  # picklable by name for spawned workers
    return TorchShards(sizes, torch_worker_info)

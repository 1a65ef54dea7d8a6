"""Training data of a launch: built-in generated sets and the batch order.

A data source is a function returning ``(x, y)`` NumPy arrays (or a dict with
``"train"`` and ``"eval"`` pairs). It runs on the coordinator only, which sends
each step's inputs to the first stage and its targets to the last (of each
replica: its shard of them).

>>> x, y = spirals(n=100, seed=0)
>>> x.shape, y.shape, x.dtype.name, y.dtype.name
((100, 2), (100,), 'float32', 'int64')
>>> train, held_out = split((x, y), eval_fraction=0.2, seed=0)
>>> b = Batches(train, batch_size=10, seed=0)
>>> b.steps_per_epoch, b.batch(0)[0].shape, len(held_out[0])
(8, (10, 2), 20)

The order of batches is a function of the seed and the step alone, so a run
resumed from a checkpoint sees the same batches as one that never stopped, and
the replicas of a data-parallel run together see the same batches as one process:

>>> [len(x) for x, _ in Batches(train, batch_size=10, seed=0, replicas=2).shards(0)]
[5, 5]
"""
import numpy as np

from distgrad.utils.data import DistributedSampler

__all__ = ["spirals", "gaussians", "split", "Batches", "micro_batches", "BUILTIN"]


def spirals(n=4096, turns=2.0, noise=0.02, seed=0):
    """Two interleaved spirals in the plane: class 0 and class 1, ``n`` points."""
    rng = np.random.default_rng(seed)
    t = np.sqrt(rng.random(n)) * turns * 2 * np.pi   # denser towards the outside
    label = rng.integers(0, 2, n)
    radius = t / (turns * 2 * np.pi)
    angle = t + label * np.pi
    x = np.stack([radius * np.cos(angle), radius * np.sin(angle)], axis=1)
    x += noise * rng.standard_normal(x.shape)
    return x.astype(np.float32), label.astype(np.int64)


def gaussians(n=2048, dim=16, classes=4, spread=1.0, seed=0):
    """``classes`` Gaussian clusters in ``dim`` dimensions (for sizing benchmarks)."""
    rng = np.random.default_rng(seed)
    centers = rng.standard_normal((classes, dim)) * 2.0
    label = rng.integers(0, classes, n)
    x = centers[label] + spread * rng.standard_normal((n, dim))
    return x.astype(np.float32), label.astype(np.int64)


#: built-in names accepted by ``data.source``
BUILTIN = {"spirals": spirals, "gaussians": gaussians}


def split(data, eval_fraction, seed):
    """``(train_x, train_y), (eval_x, eval_y)`` from what a source returned: its own
    "train"/"eval" dict, or ``(x, y)`` of which ``eval_fraction`` is held out."""
    if isinstance(data, dict):
        if "train" not in data:
            raise ValueError("a data source returning a dict must give 'train': (x, y) "
                             "and optionally 'eval': (x, y)")
        train = _pair(data["train"], "train")
        held = _pair(data["eval"], "eval") if data.get("eval") is not None \
            else (train[0][:0], train[1][:0])
        return train, held
    x, y = _pair(data, "data")
    order = np.random.default_rng((seed, 0x5EED)).permutation(len(x))
    n_eval = int(round(len(x) * eval_fraction))
    held, kept = order[:n_eval], order[n_eval:]
    return (x[kept], y[kept]), (x[held], y[held])


def _pair(value, what):
    if not (isinstance(value, (tuple, list)) and len(value) == 2):
        raise ValueError(f"a data source must return (x, y) for its {what}, got "
                         f"{type(value).__name__}")
    x, y = (np.asarray(a) for a in value)
    if len(x) != len(y):
        raise ValueError(f"a data source returned {len(x)} inputs but {len(y)} targets")
    if x.dtype.kind == "f" and x.dtype != np.float32:
        x = x.astype(np.float32)  # the models' parameters are float32
    return np.ascontiguousarray(x), np.ascontiguousarray(y)


class Batches:
    """The training batches of every step, whole (``batch``) or in replicas' shards.

    An epoch's order is ``DistributedSampler``'s with one replica (PyTorch's
    ``randperm`` seeded with ``seed + epoch``) and step ``s`` of the epoch takes the
    next ``batch_size`` samples of it. With ``replicas`` R, replica r's shard of that
    batch (``shards(s)[r]``) is every R-th of those samples from the r-th on: exactly
    the batch of ``batch_size / R`` samples that ``DistributedSampler(train,
    num_replicas=R, rank=r, seed=seed, drop_last=True)`` (with ``set_epoch``) gives
    replica r at that step. So R replicas see the samples one process sees, for any R.
    """

    def __init__(self, train, batch_size, seed, replicas=1):
        self.x, self.y = train
        if batch_size > len(self.x):
            raise ValueError(f"data.batch_size {batch_size} exceeds the {len(self.x)} "
                             "training samples")
        if batch_size % replicas:
            raise ValueError(f"data.batch_size {batch_size} cannot be split into {replicas} "
                             "equal shards")
        self.batch_size, self.seed, self.replicas = batch_size, seed, replicas
        self.steps_per_epoch = len(self.x) // batch_size
        self._sampler = DistributedSampler(range(len(self.x)), num_replicas=1, rank=0,
                                           seed=seed)
        self._epoch, self._order = None, None

    def _take(self, step):
        epoch, index = divmod(step, self.steps_per_epoch)
        if epoch != self._epoch:
            self._sampler.set_epoch(epoch)
            self._epoch, self._order = epoch, np.fromiter(self._sampler, dtype=np.int64)
        return self._order[index * self.batch_size:(index + 1) * self.batch_size]

    def batch(self, step):
        """``(x, y)`` of step ``step``: all replicas' samples."""
        take = self._take(step)
        return self.x[take], self.y[take]

    def shards(self, step):
        """``[(x, y)]`` of step ``step``, one per replica (equal sizes)."""
        take = self._take(step)
        return [(self.x[t], self.y[t]) for t in (take[r::self.replicas]
                                                  for r in range(self.replicas))]


def micro_batches(array, count):
    """Split along the first dimension into ``count`` nearly equal contiguous parts."""
    return [np.ascontiguousarray(a) for a in np.array_split(array, count)]

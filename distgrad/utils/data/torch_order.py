"""PyTorch's ``randperm`` for a seed, bit for bit, where an order is defined by a seed alone.

``DistributedSampler`` shuffles with ``torch.Generator().manual_seed(seed +
epoch)``: every replica must derive the same order from the seed, and a job
that mixes distgrad and PyTorch processes (or is ported from PyTorch) expects
the shards PyTorch would give. PyTorch's CPU generator is a 32-bit Mersenne
Twister seeded with the low 32 bits of the seed (the classic ``init_genrand``,
which NumPy's legacy seeding shares), and its CPU ``randperm`` is a
Fisher-Yates shuffle drawing ``random() % (n - i)`` for position ``i``.
Checked against PyTorch in ``tests/utils/test_data.py``.

>>> torch_randperm(10, 0)
[4, 1, 7, 5, 3, 9, 0, 8, 6, 2]
"""
import numpy as np

__all__ = ["torch_randperm"]

# Past this size PyTorch draws 64-bit numbers instead (n >= 2**32 / 20).
_MAX_N = (1 << 32) // 20


def torch_randperm(n, seed):
    """``torch.randperm(n, generator=torch.Generator().manual_seed(seed)).tolist()``."""
    if not 0 <= n < _MAX_N:
        raise ValueError(f"torch_randperm supports 0 <= n < {_MAX_N}, got n={n}")
    bits = np.random.MT19937()
    bits.state = np.random.RandomState(seed & 0xFFFFFFFF).get_state(legacy=False)
    positions = np.arange(max(n - 1, 0), dtype=np.uint64)
    targets = (bits.random_raw(positions.size) % (np.uint64(n) - positions) + positions).tolist()
    order = list(range(n))
    for i, j in enumerate(targets):
        order[i], order[j] = order[j], order[i]
    return order

"""Activation offloading: saved-tensor hooks that move activations out of the process.

>>> import distgrad
>>> from distgrad.offload import save_on_disk, OffloadPolicy
>>> model = distgrad.nn.Sequential(distgrad.nn.Linear(64, 64), distgrad.nn.Tanh())
>>> with save_on_disk(policy=OffloadPolicy(min_bytes=0)) as hooks:
...     loss = model(distgrad.randn(8, 64)).sum()
>>> loss.backward()
>>> hooks.stats.tensors_offloaded
1
>>> hooks.close()

``save_on_disk`` (record files in a per-run directory), ``save_on_remote`` (an
activation store: ``distgrad store``, or an RPC worker's role), ``save_tiered``
(memory up to a budget, then disk or a store); ``OffloadPolicy`` chooses what
leaves; ``hooks_from_config`` builds any of them from a TOML table.
"""
from .config import hooks_from_config
from .contexts import save_on_disk, save_on_remote, save_tiered
from .errors import CorruptRecordError, OffloadError, StoreError
from .hooks import OffloadHooks
from .policy import OffloadPolicy
from .stats import OffloadStats

__all__ = ["save_on_disk", "save_on_remote", "save_tiered", "OffloadHooks", "OffloadPolicy",
           "OffloadStats", "OffloadError", "CorruptRecordError", "StoreError",
           "hooks_from_config"]

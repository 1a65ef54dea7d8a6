"""``distgrad.random``: the global generator's state, as ``torch.random``.

>>> import distgrad
>>> with distgrad.random.fork_rng():
...     a = distgrad.rand(2)
>>> bool((distgrad.rand(2) == a).all())   # the same draws: the fork put the state back
True
"""
import contextlib

from .autograd.device import CPU_ONLY
from .ops.creation import get_rng_state, initial_seed, manual_seed, seed, set_rng_state

__all__ = ["set_rng_state", "get_rng_state", "manual_seed", "seed", "initial_seed", "fork_rng"]


@contextlib.contextmanager
def fork_rng(devices=None, enabled=True, _caller="fork_rng", _devices_kw="devices",
             device_type=None):
    """Restore the global generator's state when the block ends (``enabled=False``: do
    nothing). distgrad has only the CPU generator: ``devices`` may be None or empty."""
    if device_type == "meta" or not enabled:
        yield
        return
    if devices is not None and list(devices):
        raise RuntimeError(f"{CPU_ONLY}: {_caller}() cannot fork the generators of devices "
                           f"{list(devices)} ({_devices_kw}=); give {_devices_kw}=[] or None")
    state = get_rng_state()
    try:
        yield
    finally:
        set_rng_state(state)

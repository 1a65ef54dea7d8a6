"""``distgrad.cuda``: what a PyTorch program asks of CUDA, answered for a CPU-only library.

Programs pick their device with ``"cuda" if torch.cuda.is_available() else "cpu"``
and seed every generator they know of; those calls work. Anything that needs a
GPU raises ``RuntimeError`` saying distgrad runs on the CPU only.

>>> import distgrad
>>> distgrad.cuda.is_available(), distgrad.cuda.device_count()
(False, 0)
"""
from .autograd.device import CPU_ONLY

__all__ = ["is_available", "device_count", "is_initialized", "manual_seed", "manual_seed_all",
           "seed", "seed_all", "empty_cache", "memory_allocated", "max_memory_allocated",
           "current_device", "set_device", "get_device_name", "synchronize"]


def is_available():
    return False


def device_count():
    return 0


def is_initialized():
    return False


# Seeding and cache release do nothing without a GPU, as in a CPU-only PyTorch.
def manual_seed(seed):
    pass


def manual_seed_all(seed):
    pass


def seed():
    pass


def seed_all():
    pass


def empty_cache():
    pass


def memory_allocated(device=None):
    return 0


def max_memory_allocated(device=None):
    return 0


def _unavailable(what):
    raise RuntimeError(f"{CPU_ONLY}: distgrad.cuda.{what}() needs a CUDA device and there is none")


def current_device():
    _unavailable("current_device")


def set_device(device):
    _unavailable("set_device")


def get_device_name(device=None):
    _unavailable("get_device_name")


def synchronize(device=None):
    _unavailable("synchronize")

"""``distgrad.accelerator``: there is none; distgrad computes on the CPU.

>>> import distgrad
>>> distgrad.accelerator.is_available(), distgrad.accelerator.current_accelerator()
(False, None)
"""
__all__ = ["is_available", "current_accelerator", "device_count"]


def is_available():
    return False


def current_accelerator(check_available=False):
    return None


def device_count():
    return 0

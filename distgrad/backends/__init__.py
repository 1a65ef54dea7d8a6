"""``distgrad.backends``: the switches PyTorch programs set, for a CPU-only library.

``distgrad.backends.cudnn.deterministic = True`` and friends are accepted and
remembered; they change nothing, since distgrad computes with NumPy on the
CPU (and is deterministic for a given seed).
"""
from . import cuda, cudnn, mps

__all__ = ["cuda", "cudnn", "mps"]

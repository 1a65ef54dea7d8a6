"""Running programs written for PyTorch on distgrad without editing them.

:mod:`distgrad.compat.as_torch` makes ``import torch`` (and ``torch.*``) import
distgrad in a process and in every Python process it starts::

    python -m distgrad.compat.as_torch train.py --epochs 3
"""

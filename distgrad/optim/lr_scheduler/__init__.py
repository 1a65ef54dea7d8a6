"""Learning-rate schedulers, as ``torch.optim.lr_scheduler``.

A scheduler rewrites ``group["lr"]`` of its optimizer's parameter groups at each
``step()``. The arithmetic is PyTorch's, formula for formula (most schedules are
chained: each lr is computed from the previous one, not from a closed form), so a
schedule run in both libraries gives the same floats.

>>> import distgrad
>>> p = distgrad.nn.Parameter(distgrad.zeros(1))
>>> opt = distgrad.optim.SGD([p], lr=1.0)
>>> sched = StepLR(opt, step_size=2, gamma=0.5)
>>> for _ in range(4):
...     opt.step(); sched.step()
>>> sched.get_last_lr()
[0.25]
"""
from .base import EPOCH_DEPRECATION_WARNING, LRScheduler
from .composite import ChainedScheduler, SequentialLR
from .cyclic import CosineAnnealingWarmRestarts, CyclicLR, OneCycleLR
from .plateau import ReduceLROnPlateau
from .schedules import (ConstantLR, CosineAnnealingLR, ExponentialLR, LambdaLR, LinearLR,
                        MultiplicativeLR, MultiStepLR, PolynomialLR, StepLR)

__all__ = ["LambdaLR", "MultiplicativeLR", "StepLR", "MultiStepLR", "ConstantLR", "LinearLR",
           "ExponentialLR", "SequentialLR", "CosineAnnealingLR", "ChainedScheduler",
           "ReduceLROnPlateau", "CyclicLR", "CosineAnnealingWarmRestarts", "OneCycleLR",
           "PolynomialLR", "LRScheduler"]

_LRScheduler = LRScheduler  # PyTorch's old name

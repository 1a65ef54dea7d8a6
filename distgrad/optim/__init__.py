"""``distgrad.optim``: optimizers, as ``torch.optim``."""
from .optimizer import Optimizer
from .sgd import SGD
from .adam import Adam
from .adamw import AdamW

__all__ = ["Optimizer", "SGD", "Adam", "AdamW"]

"""``distgrad.optim``: optimizers and learning-rate schedulers, as ``torch.optim``."""
from .optimizer import Optimizer
from .sgd import SGD
from .adam import Adam
from .adamw import AdamW
from .adadelta import Adadelta
from .adagrad import Adagrad
from .adamax import Adamax
from .lbfgs import LBFGS
from .nadam import NAdam
from .radam import RAdam
from .rmsprop import RMSprop
from . import lr_scheduler

__all__ = ["Optimizer", "SGD", "Adam", "AdamW", "Adadelta", "Adagrad", "Adamax", "LBFGS",
           "NAdam", "RAdam", "RMSprop", "lr_scheduler"]

"""``distgrad.nn``: modules, layers, losses, as ``torch.nn``."""
from . import functional

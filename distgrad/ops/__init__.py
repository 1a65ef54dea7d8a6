"""Ops: forward and VJP rules, one table per family, installed as Tensor methods."""
from . import methods as _methods

_methods.install()

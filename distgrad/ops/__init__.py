"""Ops: forward and VJP rules, one table per family; ``methods.py`` makes them Tensor methods."""
from ..autograd._internal import install_backends
from . import np_backend as _np_backend, tensor_backend as _tensor_backend
from .overloads import aten, prim  # noqa: F401 - torch.ops.aten / torch.ops.prim: op names

install_backends(_np_backend, _tensor_backend)

"""Ops: forward and VJP rules, one table per family; ``methods.py`` makes them Tensor methods."""
from ..autograd._internal import install_backends
from . import np_backend as _np_backend, op_names as _op_names, tensor_backend as _tensor_backend

# before distgrad.Tensor takes the ops as methods and distgrad.* re-exports them: every way
# of calling an op is seen by the profiler
_op_names.install()
from .overloads import aten, prim  # noqa: E402,F401 - torch.ops.aten / torch.ops.prim: op names
install_backends(_np_backend, _tensor_backend)

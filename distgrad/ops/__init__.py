"""Ops: forward and VJP rules, one table per family, installed as Tensor methods."""
from ..autograd._internal import install_backends
from . import methods as _methods, np_backend as _np_backend, tensor_backend as _tensor_backend
from . import op_names as _op_names

_op_names.install()  # before the ops become methods and distgrad.*: every way in is seen
_methods.install()
install_backends(_np_backend, _tensor_backend)

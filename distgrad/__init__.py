"""distgrad: a reverse-mode autograd engine on NumPy whose graph can span processes.

The API is PyTorch's: ``import distgrad as torch`` and a program written against
``torch.autograd``, ``torch.nn`` and ``torch.distributed.rpc`` runs.

>>> import distgrad
>>> x = distgrad.tensor([1.0, 2.0], requires_grad=True)
>>> (x * x).sum().backward()
>>> x.grad
tensor([2., 4.])
"""
from .autograd.dtype import (bool, complex64, complex128, dtype, float16, float32, float64,  # noqa: A004
                             get_default_dtype, int8, int16, int32, int64, set_default_dtype, uint8)
from .autograd.grad_mode import (enable_grad, inference_mode, is_grad_enabled,
                                 is_inference_mode_enabled, no_grad, set_grad_enabled)
from .autograd.tensor import Size, is_tensor
from ._tensor import Tensor
from .autograd.device import device
from .ops.arithmetic import *  # noqa: F401,F403
from .ops.complex import *  # noqa: F401,F403
from .ops.conversion import *  # noqa: F401,F403
from .ops.creation import *  # noqa: F401,F403
from .ops.indexing import *  # noqa: F401,F403
from .ops.legacy import *  # noqa: F401,F403
from .ops.random import *  # noqa: F401,F403
from .ops.scatter import *  # noqa: F401,F403
from .ops.linalg import matmul, mm, bmm, dot, mv, outer  # noqa: F401
from .ops.einsum import einsum  # noqa: F401
from .ops.reduction import *  # noqa: F401,F403
from .ops.shape import *  # noqa: F401,F403
from .ops.softmax import *  # noqa: F401,F403
from .ops.unary import *  # noqa: F401,F403
from .ops.unary import gelu as _gelu
from .serialization import load, save
from . import sparse  # noqa: F401 - torch.sparse
from .sparse import layout, sparse_coo, sparse_coo_tensor, strided  # noqa: F401
from .ops.linalg import mm as spmm  # noqa: F401 - torch.spmm is mm (MmBackward0)
from .ops.diag import diag, diag_embed, diagflat  # noqa: F401
from ._tensor_str import set_printoptions  # noqa: F401
from .compiler import compile  # noqa: A004
from .threads import get_num_threads, set_num_threads
from .flush_denormal import set_flush_denormal
from . import autograd
from . import nn
from . import utils
from .utils.lazy import submodules_on_first_use as _submodules_on_first_use

float = float32  # noqa: A001 - PyTorch's aliases
double = float64
half = float16
long = int64
int = int32  # noqa: A001
cfloat = complex64
cdouble = complex128

__version__ = "0.1.0"


def is_floating_point(input):
    return input.is_floating_point()


def numel(input):
    return input.numel()


# optim, distributed and the other subpackages load on first use, as `torch.distributed`
# does, so that `import distgrad` stays cheap and the RPC layer's dependencies are optional
# here.
__getattr__ = _submodules_on_first_use(__name__)

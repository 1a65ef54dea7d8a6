"""``distgrad.nn``: modules, layers, losses, as ``torch.nn``."""
from . import functional
from .parameter import Parameter
from .modules import *  # noqa: F401,F403
from .modules import __all__ as _modules_all
from . import init, utils
from . import parallel  # noqa: F401 - nn.parallel.DistributedDataParallel
from .parallel import DataParallel

__all__ = ["functional", "Parameter", "init", "utils", "DataParallel", *_modules_all]

"""Distributed features with PyTorch's names (``torch.distributed`` equivalent)."""
from . import rpc  # noqa: F401


def __getattr__(name):
    # autograd, optim and nn load on first use (they install the RPC message interceptor)
    import importlib
    if name in ("autograd", "optim", "nn"):
        module = importlib.import_module(f".{name}", __name__)
        globals()[name] = module
        return module
    raise AttributeError(f"module 'distgrad.distributed' has no attribute {name!r}")

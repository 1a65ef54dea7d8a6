"""Distributed features with PyTorch's names (``torch.distributed`` equivalent)."""
from . import rpc  # noqa: F401

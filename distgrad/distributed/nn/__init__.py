"""``torch.distributed.nn`` for distgrad: :class:`RemoteModule`."""
from .remote_module import RemoteModule

__all__ = ["RemoteModule"]

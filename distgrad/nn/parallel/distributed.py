"""``torch.nn.parallel.DistributedDataParallel``: the type, at PyTorch's path.

Its implementation needs process groups, a layer above ``nn``, so it lives in
``distgrad/distributed/ddp.py`` and registers itself here when ``distgrad.distributed``
is imported (as every program that has a process group to wrap a model in has done).
``DistributedDataParallel(module)`` builds the registered implementation, which is a
subclass of this type: ``isinstance`` checks and subclasses of this class work as with
PyTorch's.

In every process of an initialised process group (a complete program:
``scripts/example_ddp.py``)::

    model = DistributedDataParallel(net)
    loss_fn(model(x), y).backward()   # .grad now holds the average over all ranks
"""
from ..modules.module import Module

__all__ = ["DistributedDataParallel", "implemented_by"]

_implementation = []   # [the class distgrad.distributed registers]
_combined = {}         # a subclass of this type -> it, with the implementation under it


class DistributedDataParallel(Module):
    """Replicates a module in every process of a process group and averages its gradients
    (see ``distgrad.distributed.ddp``)."""

    def __new__(cls, *args, **kwargs):
        if not _implementation:  # nothing imported distgrad.distributed: no group exists
            raise ValueError("Default process group has not been initialized, please make "
                             "sure to call init_process_group.")
        impl = _implementation[0]
        if not issubclass(cls, impl):
            cls = impl if cls is DistributedDataParallel else _with_implementation(cls, impl)
        return super().__new__(cls)


def _with_implementation(cls, impl):
    """A user's subclass of this type, with the implementation below its own methods."""
    combined = _combined.get(cls)
    if combined is None:
        combined = _combined[cls] = type(cls.__name__, (cls, impl),
                                         {"__module__": cls.__module__,
                                          "__qualname__": cls.__qualname__})
    return combined


def implemented_by(impl):
    """Register ``impl`` (a subclass of :class:`DistributedDataParallel`) as what the type
    builds; ``distgrad.distributed`` calls it once on import."""
    _implementation[:] = [impl]

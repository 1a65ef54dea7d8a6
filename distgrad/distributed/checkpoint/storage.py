"""The storage protocol (``torch.distributed.checkpoint.storage``): where a checkpoint's
bytes go and come from. :mod:`.filesystem` implements it for a directory."""
import abc
import functools
import warnings
from dataclasses import dataclass
from typing import Any

from .metadata import MetadataIndex, index_from_data, index_to_data

__all__ = ["WriteResult", "StorageWriter", "StorageReader", "write_results_to_data",
           "write_results_from_data", "positional_storage"]


@dataclass(frozen=True)
class WriteResult:
    """Where the bytes of one written item are (``storage_data``: plain data)."""
    index: MetadataIndex
    size_in_bytes: int
    storage_data: Any


def write_results_to_data(results):
    return [[index_to_data(r.index), r.size_in_bytes, r.storage_data] for r in results]


def write_results_from_data(data):
    return [WriteResult(index_from_data(i), n, s) for i, n, s in data]


class StorageWriter(abc.ABC):
    """Order of calls in a save: ``reset`` (new checkpoint id), ``set_up_storage_writer``,
    ``prepare_local_plan``, on the coordinator ``prepare_global_plan``, ``write_data``,
    and on the coordinator ``finish`` (which makes the checkpoint complete)."""

    @abc.abstractmethod
    def reset(self, checkpoint_id=None):
        """Start a new save (to ``checkpoint_id`` where given)."""

    @abc.abstractmethod
    def set_up_storage_writer(self, is_coordinator, *args, **kwargs):
        """``kwargs``: ``rank`` and ``use_collectives``."""

    @abc.abstractmethod
    def prepare_local_plan(self, plan):
        ...

    @abc.abstractmethod
    def prepare_global_plan(self, plans):
        ...

    @abc.abstractmethod
    def write_data(self, plan, planner):
        """Write every item of ``plan``; a Future of ``[WriteResult]``."""

    @abc.abstractmethod
    def finish(self, metadata, results):
        """Commit the checkpoint: ``results`` is every rank's list of WriteResult."""

    @classmethod
    @abc.abstractmethod
    def validate_checkpoint_id(cls, checkpoint_id):
        """Whether ``checkpoint_id`` is something this storage can write to."""

    def storage_meta(self):
        return None


class StorageReader(abc.ABC):
    """Order of calls in a load: ``reset``, ``read_metadata``, ``set_up_storage_reader``,
    ``prepare_local_plan``, on the coordinator ``prepare_global_plan``, ``read_data``."""

    @abc.abstractmethod
    def reset(self, checkpoint_id=None):
        ...

    @abc.abstractmethod
    def read_metadata(self, *args, **kwargs):
        """The checkpoint's :class:`Metadata` (``kwargs``: ``rank`` for rank-local metadata)."""

    @abc.abstractmethod
    def set_up_storage_reader(self, metadata, is_coordinator, *args, **kwargs):
        ...

    @abc.abstractmethod
    def prepare_local_plan(self, plan):
        ...

    @abc.abstractmethod
    def prepare_global_plan(self, plans):
        ...

    @abc.abstractmethod
    def read_data(self, plan, planner):
        """Read every item of ``plan`` through ``planner``; a Future of None."""

    @classmethod
    @abc.abstractmethod
    def validate_checkpoint_id(cls, checkpoint_id):
        ...


def positional_storage(fn):
    """PyTorch's old argument order ``fn(state_dict, storage)``: still accepted, with a
    warning, the second argument taken as the storage writer or reader."""
    kind = "storage_writer" if fn.__name__ in ("save", "async_save") else "storage_reader"

    @functools.wraps(fn)
    def inner(*args, **kwargs):
        if len(args) == 2:
            warnings.warn(f"The argument order of {fn.__name__} has been changed. Please check "
                          "the document to avoid future breakages.", stacklevel=2)
            if kind in kwargs:
                raise TypeError(f"{fn.__name__}() got {kind} twice")
            kwargs[kind] = args[1]
            args = args[:1]
        return fn(*args, **kwargs)
    return inner

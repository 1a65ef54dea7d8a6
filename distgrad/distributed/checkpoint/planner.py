"""The planner protocol (``torch.distributed.checkpoint.planner``): what a save or load
plans to write or read, and the abstract planners users subclass.

A save runs, on every rank: ``set_up_planner`` -> ``create_local_plan``; the
coordinator (rank 0) merges all plans with ``create_global_plan`` (which also makes
the checkpoint's :class:`Metadata`), every rank gets its part back through
``finish_plan``, and the storage writer asks ``resolve_data`` for each item's value.
A load runs ``set_up_planner`` (with the checkpoint's metadata) ->
``create_local_plan`` -> ``create_global_plan`` (coordinator) -> ``finish_plan``; the
reader then calls ``load_bytes`` for non-tensor items, and ``resolve_tensor`` /
``commit_tensor`` around each tensor it copies into.

Plans cross ranks as plain data (:func:`save_plan_to_data` and friends): a custom
planner's ``planner_data`` and a custom storage's ``storage_data`` must be values
:mod:`distgrad.codec` carries (numbers, strings, lists, tuples, dicts, arrays).
"""
import abc
from dataclasses import dataclass
from enum import Enum, auto
from typing import Any, Optional

from distgrad.autograd.tensor import Size

from .metadata import (ChunkStorageMetadata, MetadataIndex, index_from_data, index_to_data,
                       properties_from_data, properties_to_data)

__all__ = ["WriteItemType", "LoadItemType", "BytesIOWriteData", "TensorWriteData", "WriteItem",
           "ReadItem", "SavePlan", "LoadPlan", "SavePlanner", "LoadPlanner",
           "save_plan_to_data", "save_plan_from_data", "load_plan_to_data",
           "load_plan_from_data"]


class WriteItemType(Enum):
    TENSOR = auto()
    SHARD = auto()
    BYTE_IO = auto()


class LoadItemType(Enum):
    TENSOR = auto()
    BYTE_IO = auto()


@dataclass(frozen=True)
class BytesIOWriteData:
    nbytes: int


@dataclass(frozen=True)
class TensorWriteData:
    chunk: ChunkStorageMetadata
    properties: Any
    size: Size


@dataclass(frozen=True)
class WriteItem:
    """One value to write: a tensor (chunk), or any other object as bytes."""
    index: MetadataIndex
    type: WriteItemType
    bytes_io_data: Optional[BytesIOWriteData] = None
    tensor_data: Optional[TensorWriteData] = None

    def tensor_storage_size(self):
        """Bytes of the tensor this item writes, or None for a non-tensor item."""
        if self.tensor_data is None:
            return None
        n = 1
        for s in self.tensor_data.chunk.sizes:
            n *= s
        return n * self.tensor_data.properties.dtype.itemsize


@dataclass(frozen=True)
class ReadItem:
    """Copy the box of ``lengths`` at ``storage_offsets`` of stored item
    ``storage_index`` into ``dest_offsets`` of state-dict entry ``dest_index``."""
    type: LoadItemType
    dest_index: MetadataIndex
    dest_offsets: Size
    storage_index: MetadataIndex
    storage_offsets: Size
    lengths: Size


@dataclass(frozen=True)
class SavePlan:
    items: list
    storage_data: Any = None
    planner_data: Any = None
    usable: bool = True


@dataclass
class LoadPlan:
    items: list
    storage_data: Any = None
    planner_data: Any = None


class SavePlanner(abc.ABC):
    """How a state dict becomes write items; see the module docstring for the order of
    the calls. Subclass :class:`DefaultSavePlanner` to change a part of it."""

    @abc.abstractmethod
    def set_up_planner(self, state_dict, storage_meta=None, is_coordinator=False):
        """Take the state dict to save (and the storage's description of the save)."""

    @abc.abstractmethod
    def create_local_plan(self):
        """This rank's :class:`SavePlan`."""

    @abc.abstractmethod
    def create_global_plan(self, all_plans):
        """On the coordinator: ``(plans, Metadata)`` from every rank's plan."""

    @abc.abstractmethod
    def finish_plan(self, new_plan):
        """The plan the coordinator gave this rank, as this rank will carry it out."""

    @abc.abstractmethod
    def resolve_data(self, write_item):
        """The value to write for ``write_item``: a tensor, or a ``io.BytesIO``."""


class LoadPlanner(abc.ABC):
    """How a checkpoint's items go into a state dict; see the module docstring."""

    @abc.abstractmethod
    def set_up_planner(self, state_dict, metadata=None, is_coordinator=False):
        """Take the state dict to fill and the checkpoint's metadata."""

    @abc.abstractmethod
    def create_local_plan(self):
        """This rank's :class:`LoadPlan`."""

    @abc.abstractmethod
    def create_global_plan(self, global_plan):
        """On the coordinator: every rank's final plan."""

    @abc.abstractmethod
    def finish_plan(self, central_plan):
        """The plan this rank carries out."""

    @abc.abstractmethod
    def load_bytes(self, read_item, value):
        """Take a non-tensor item's value (``value`` is a ``io.BytesIO``)."""

    def resolve_bytes(self, read_item):
        raise NotImplementedError(f"{type(self).__name__} reads no bytes into buffers")

    @abc.abstractmethod
    def resolve_tensor(self, read_item):
        """The tensor (or view) the reader copies ``read_item``'s data into."""

    @abc.abstractmethod
    def commit_tensor(self, read_item, tensor):
        """Called after ``tensor`` (from :meth:`resolve_tensor`) was filled."""


# ------------------------------------------------------------------ plain data
def _write_item_to_data(item):
    t = item.tensor_data
    return [index_to_data(item.index), item.type.name,
            None if item.bytes_io_data is None else item.bytes_io_data.nbytes,
            None if t is None else [list(t.chunk.offsets), list(t.chunk.sizes),
                                    properties_to_data(t.properties), list(t.size)]]


def _write_item_from_data(data):
    index, kind, nbytes, t = data
    return WriteItem(index_from_data(index), WriteItemType[kind],
                     None if nbytes is None else BytesIOWriteData(nbytes),
                     None if t is None else TensorWriteData(
                         ChunkStorageMetadata(Size(t[0]), Size(t[1])),
                         properties_from_data(t[2]), Size(t[3])))


def save_plan_to_data(plan):
    return [[_write_item_to_data(i) for i in plan.items], plan.storage_data, plan.planner_data,
            plan.usable]


def save_plan_from_data(data):
    items, storage_data, planner_data, usable = data
    return SavePlan([_write_item_from_data(i) for i in items], storage_data, planner_data, usable)


def _read_item_to_data(r):
    return [r.type.name, index_to_data(r.dest_index), list(r.dest_offsets),
            index_to_data(r.storage_index), list(r.storage_offsets), list(r.lengths)]


def _read_item_from_data(d):
    return ReadItem(LoadItemType[d[0]], index_from_data(d[1]), Size(d[2]), index_from_data(d[3]),
                    Size(d[4]), Size(d[5]))


def load_plan_to_data(plan):
    return [[_read_item_to_data(i) for i in plan.items], plan.storage_data, plan.planner_data]


def load_plan_from_data(data):
    items, storage_data, planner_data = data
    return LoadPlan([_read_item_from_data(i) for i in items], storage_data, planner_data)


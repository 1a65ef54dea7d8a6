"""What a checkpoint says about itself: which entries it holds, their shapes and types,
and where their bytes are (``torch.distributed.checkpoint.metadata``'s classes).

The classes are plain dataclasses. Every object that crosses ranks (plans, write
results) or goes into the ``.metadata`` file becomes plain data first
(:func:`metadata_to_data` / :func:`metadata_from_data` here, the plans' in
``planner.py``): lists, dicts, strings and numbers that :mod:`distgrad.codec`
carries, never pickle.
"""
import os
from dataclasses import dataclass, field
from typing import Any, Optional

from distgrad.autograd.dtype import dtype as _dtype_class, from_numpy_dtype, get_default_dtype
from distgrad.autograd.tensor import Size
from distgrad.sparse.layout import strided

from .stateful import StatefulT  # noqa: F401 - PyTorch exports it from here as well

__all__ = ["ChunkStorageMetadata", "TensorStorageMetadata", "BytesStorageMetadata", "Metadata",
           "MetadataIndex", "TensorProperties", "StorageMeta", "STATE_DICT_TYPE",
           "STORAGE_TYPES", "metadata_to_data", "metadata_from_data", "index_to_data",
           "index_from_data", "properties_to_data", "properties_from_data"]

STATE_DICT_TYPE = dict


@dataclass
class ChunkStorageMetadata:
    """One stored box of a tensor: where it starts (``offsets``) and its ``sizes``."""
    offsets: Size
    sizes: Size


@dataclass
class TensorProperties:
    """What a tensor is made with besides its shape."""
    dtype: Any = field(default_factory=get_default_dtype)
    layout: Any = strided
    requires_grad: bool = False
    memory_format: Any = None
    pin_memory: bool = False

    @staticmethod
    def create_from_tensor(tensor):
        return TensorProperties(dtype=tensor.dtype, requires_grad=tensor.requires_grad)


@dataclass
class TensorStorageMetadata:
    properties: TensorProperties
    size: Size
    chunks: list


@dataclass
class BytesStorageMetadata:
    pass


STORAGE_TYPES = (TensorStorageMetadata, BytesStorageMetadata)


@dataclass
class StorageMeta:
    checkpoint_id: Optional[Any] = None
    save_id: Optional[str] = None
    load_id: Optional[str] = None
    modules: list = field(default_factory=list)


@dataclass
class Metadata:
    """The whole checkpoint: ``state_dict_metadata`` maps each (flattened) key to
    :class:`TensorStorageMetadata` or :class:`BytesStorageMetadata`; ``planner_data``
    is the save planner's (the default one: how flat keys nest), ``storage_data`` the
    storage writer's (the file system's: where each item's bytes are)."""
    state_dict_metadata: dict
    planner_data: Any = None
    storage_data: Any = None
    storage_meta: Optional[StorageMeta] = None
    version: Optional[str] = None


@dataclass(frozen=True)
class MetadataIndex:
    """Names one item: a key (``fqn``), for a tensor the ``offset`` of its chunk, and an
    ``index`` hint into the chunk list that does not take part in comparisons."""
    fqn: str
    offset: Optional[Size] = None
    index: Optional[int] = field(hash=False, compare=False, default=None)

    def __init__(self, fqn, offset=None, index=None):
        object.__setattr__(self, "fqn", fqn)
        object.__setattr__(self, "index", index)
        object.__setattr__(self, "offset", None if offset is None else Size(offset))


# ------------------------------------------------------------------ plain data
def _dtype_name(d):
    if not isinstance(d, _dtype_class):
        raise TypeError(f"a checkpointed tensor's dtype must be a distgrad dtype, not {d!r}")
    return d.numpy.str


def properties_to_data(p):
    return [_dtype_name(p.dtype), bool(p.requires_grad)]


def properties_from_data(data):
    import numpy as np
    name, requires_grad = data
    return TensorProperties(dtype=from_numpy_dtype(np.dtype(name)), requires_grad=requires_grad)


def index_to_data(index):
    return [index.fqn, None if index.offset is None else list(index.offset), index.index]


def index_from_data(data):
    return MetadataIndex(data[0], data[1], data[2])


def _storage_to_data(md):
    if isinstance(md, BytesStorageMetadata):
        return ["bytes"]
    return ["tensor", properties_to_data(md.properties), list(md.size),
            [[list(c.offsets), list(c.sizes)] for c in md.chunks]]


def _storage_from_data(data):
    if data[0] == "bytes":
        return BytesStorageMetadata()
    _, props, size, chunks = data
    return TensorStorageMetadata(properties_from_data(props), Size(size),
                                 [ChunkStorageMetadata(Size(o), Size(s)) for o, s in chunks])


def _id_to_data(checkpoint_id):
    return None if checkpoint_id is None else os.fspath(checkpoint_id) \
        if isinstance(checkpoint_id, os.PathLike) else checkpoint_id


def metadata_to_data(md):
    """``md`` as plain data (see the module docstring); ``storage_data`` is a dict of
    :class:`MetadataIndex` to plain data, or plain data itself."""
    storage = md.storage_data
    if isinstance(storage, dict) and all(isinstance(k, MetadataIndex) for k in storage):
        storage = {"by_index": [[index_to_data(k), v] for k, v in storage.items()]}
    meta = md.storage_meta
    return {"version": md.version,
            "state_dict_metadata": {k: _storage_to_data(v)
                                    for k, v in md.state_dict_metadata.items()},
            "planner_data": md.planner_data, "storage_data": storage,
            "storage_meta": None if meta is None else
            [_id_to_data(meta.checkpoint_id), meta.save_id, meta.load_id, list(meta.modules)]}


def metadata_from_data(data):
    storage = data["storage_data"]
    if isinstance(storage, dict) and set(storage) == {"by_index"}:
        storage = {index_from_data(k): v for k, v in storage["by_index"]}
    meta = data["storage_meta"]
    return Metadata({k: _storage_from_data(v) for k, v in data["state_dict_metadata"].items()},
                    planner_data=data["planner_data"], storage_data=storage,
                    storage_meta=None if meta is None else StorageMeta(*meta),
                    version=data["version"])

"""Distributed checkpoints with ``torch.distributed.checkpoint``'s API (DCP).

    import distgrad.distributed.checkpoint as dcp
    dcp.save({"model": model, "optim": optimizer}, checkpoint_id="ckpt/step-100")
    dcp.load({"model": model, "optim": optimizer}, checkpoint_id="ckpt/step-100")

Every rank of the default process group calls them (SPMD); each rank writes its own
files, rank 0 commits the checkpoint by writing its metadata last and atomically
(``filesystem.py``). Nothing is pickled: tensors are raw bytes, other values and the
metadata are in ``distgrad.save``'s format. ``state_dict`` has the helpers for DDP
models and optimizers, ``format_utils`` converts to and from ``distgrad.save`` files.
"""
from .api import CheckpointException
from .default_planner import DefaultLoadPlanner, DefaultSavePlanner
from .filesystem import FileSystemReader, FileSystemWriter
from .metadata import BytesStorageMetadata, ChunkStorageMetadata, Metadata, TensorStorageMetadata
from .planner import LoadPlan, LoadPlanner, ReadItem, SavePlan, SavePlanner, WriteItem
from .state_dict_loader import load, load_state_dict
from .state_dict_saver import AsyncCheckpointerType, async_save, save, save_state_dict
from .stateful import Stateful
from .storage import StorageReader, StorageWriter

__all__ = ["CheckpointException", "DefaultLoadPlanner", "DefaultSavePlanner", "FileSystemReader",
           "FileSystemWriter", "BytesStorageMetadata", "ChunkStorageMetadata", "Metadata",
           "TensorStorageMetadata", "LoadPlan", "LoadPlanner", "ReadItem", "SavePlan",
           "SavePlanner", "WriteItem", "load", "load_state_dict", "async_save", "save",
           "save_state_dict", "AsyncCheckpointerType", "Stateful", "StorageReader",
           "StorageWriter"]

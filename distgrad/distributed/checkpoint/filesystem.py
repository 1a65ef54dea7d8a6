"""``FileSystemWriter`` / ``FileSystemReader``: a checkpoint is a directory.

    ckpt/__0_0-<save>.distcp   rank 0's items: tensors as raw bytes, other values in
         __1_0-<save>.distcp   distgrad.save's format (each rank writes its own files)
         .metadata              written last by rank 0, atomically: the checkpoint

A tensor's bytes are its array's, C order, so loading reads straight into the
destination tensor. The metadata file (``distgrad.save``'s format, no pickle) is
written to a temporary name, synced and renamed over the old one only after every
rank reported its files synced; the data files of a save carry its id in their
names. So a save that dies midway (a rank killed, a full disk) never touches the
checkpoint that was there: ``.metadata`` still names the previous save's files,
which are still there. After a save completes, rank 0 removes the data files no
longer named (an earlier save's, or an unfinished one's).

Where PyTorch's writer has stream transforms (``_extensions``) or safetensors
output, this one raises NotImplementedError.
"""
import dataclasses
import io
import os
import queue
import re
import threading
import uuid
import warnings
from enum import Enum

import numpy as np

import distgrad
from distgrad.autograd._internal import array_of, bump_version, wrap
from distgrad.autograd.grad_mode import no_grad
from distgrad.autograd.tensor import Tensor
from distgrad.futures import Future
from distgrad.utils.atomic_files import atomic_write

from .nested_dict import flatten_state_dict, unflatten_state_dict
from .metadata import metadata_from_data, metadata_to_data, StorageMeta
from .planner import LoadItemType, WriteItemType
from .storage import StorageReader, StorageWriter, WriteResult

__all__ = ["FileSystemWriter", "FileSystemReader", "SerializationFormat", "CURRENT_DCP_VERSION",
           "storage_setup"]

CURRENT_DCP_VERSION = "1.0.0"
_METADATA = ".metadata"
_FORMAT = "distgrad-dcp"
_SUFFIX = ".distcp"
_DATA_FILE = re.compile(r"^__(\d+)_\d+-[0-9a-f]+\.distcp$")


class SerializationFormat(Enum):
    TORCH_SAVE = "torch_save"
    SAFETENSORS = "safetensors"


def _metadata_name(rank=None):
    return _METADATA if rank is None else f"__{rank}{_METADATA}"


def _validate_path_id(checkpoint_id):
    return isinstance(checkpoint_id, (str, os.PathLike)) and "://" not in os.fspath(checkpoint_id)


def _split(items, bins):
    """``bins`` lists of items of about equal bytes (greedy, largest tensors first)."""
    buckets = [[] for _ in range(max(1, bins))]
    sizes = [0] * len(buckets)
    others = [i for i in items if i.type == WriteItemType.BYTE_IO]
    tensors = sorted((i for i in items if i.type != WriteItemType.BYTE_IO),
                     key=lambda i: -(i.tensor_storage_size() or 0))
    for k, item in enumerate(others):
        buckets[k % len(buckets)].append(item)
    for item in tensors:
        k = sizes.index(min(sizes))
        buckets[k].append(item)
        sizes[k] += item.tensor_storage_size() or 0
    return [b for b in buckets if b] or [[]]


def _array(tensor):
    a = array_of(tensor)
    return a if a.flags.c_contiguous else np.ascontiguousarray(a)


class _Directory:
    """What a writer and a reader of a checkpoint directory share: the directory (``path``)
    is the checkpoint's id."""

    @property
    def checkpoint_id(self):
        return self.path

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id):
        return _validate_path_id(checkpoint_id)

    def _move_to(self, checkpoint_id):
        if checkpoint_id:
            self.path = os.fspath(checkpoint_id)


class FileSystemWriter(_Directory, StorageWriter):
    def __init__(self, path, single_file_per_rank=True, sync_files=True, thread_count=1,
                 per_thread_copy_ahead=10_000_000, cache_staged_state_dict=False, overwrite=True,
                 _extensions=None, serialization_format=SerializationFormat.TORCH_SAVE):
        if _extensions:
            raise NotImplementedError("FileSystemWriter: stream transform extensions are not "
                                      "supported by distgrad")
        if serialization_format != SerializationFormat.TORCH_SAVE:
            raise NotImplementedError(f"FileSystemWriter: {serialization_format} output is not "
                                      "supported by distgrad")
        if thread_count < 1:
            raise ValueError(f"thread_count must be at least 1, not {thread_count}")
        self.path = os.fspath(path)
        self.single_file_per_rank = single_file_per_rank
        self.sync_files = sync_files
        self.thread_count = thread_count
        self.per_thread_copy_ahead = per_thread_copy_ahead
        self.cache_staged_state_dict = cache_staged_state_dict
        self.overwrite = overwrite
        self.save_id = uuid.uuid4().hex
        self.rank = None
        self.use_collectives = True

    def reset(self, checkpoint_id=None):
        self._move_to(checkpoint_id)
        self.save_id = uuid.uuid4().hex

    def storage_meta(self):
        return StorageMeta(checkpoint_id=self.path, save_id=self.save_id)

    def set_up_storage_writer(self, is_coordinator, *args, **kwargs):
        self.rank = kwargs.get("rank")
        self.use_collectives = kwargs.get("use_collectives", True)
        self.is_coordinator = is_coordinator

    def _own_metadata(self):
        rank = None if self.use_collectives or self.rank is None else self.rank
        return os.path.join(self.path, _metadata_name(rank))

    def prepare_local_plan(self, plan):
        os.makedirs(self.path, exist_ok=True)
        if os.path.exists(self._own_metadata()):
            if not self.overwrite:
                raise RuntimeError(f"Checkpoint already exists and self.overwrite="
                                   f"{self.overwrite}.")
            warnings.warn(f"Detected an existing checkpoint in {self.path}, overwriting since "
                          f"self.overwrite={self.overwrite}.", stacklevel=2)
        if self.rank is not None and not self.use_collectives:
            plan = dataclasses.replace(plan, storage_data={"prefix": f"__{self.rank}_",
                                                          "tag": self.save_id})
        return plan

    def prepare_global_plan(self, plans):
        return [p if p.storage_data is not None else
                dataclasses.replace(p, storage_data={"prefix": f"__{i}_", "tag": self.save_id})
                for i, p in enumerate(plans)]

    # -- writing --
    def write_data(self, plan, planner):
        prefix, tag = plan.storage_data["prefix"], plan.storage_data["tag"]
        groups = _split(plan.items, self.thread_count) if self.single_file_per_rank \
            else [[item] for item in plan.items] or [[]]
        files = queue.SimpleQueue()
        for n, items in enumerate(groups):
            files.put((f"{prefix}{n}-{tag[:16]}{_SUFFIX}", items))
        results, errors = [], []

        def work():
            while True:
                try:
                    name, items = files.get_nowait()
                except queue.Empty:
                    return
                try:
                    results.extend(self._write_file(name, items, planner))
                except BaseException as e:  # noqa: BLE001 - re-raised by the caller below
                    errors.append(e)
                    return
        threads = [threading.Thread(target=work, name=f"dcp-writer-{k}", daemon=True)
                   for k in range(1, min(self.thread_count, len(groups)))]
        for t in threads:
            t.start()
        work()
        for t in threads:
            t.join()  # each ends once the queue is empty or its file failed
        if errors:
            raise errors[0]
        fut = Future()
        fut.set_result(results)
        return fut

    def _write_file(self, name, items, planner):
        out, offset = [], 0
        with open(os.path.join(self.path, name), "wb") as fh:
            for item in items:
                data = planner.resolve_data(item)
                if item.type == WriteItemType.BYTE_IO:
                    view = data.getbuffer()
                    info = [name, offset, len(view)]
                else:
                    if not isinstance(data, Tensor):
                        raise TypeError(f"the planner resolved {item.index.fqn!r} to a "
                                        f"{type(data).__name__}, not a tensor")
                    a = _array(data.detach())
                    view = memoryview(a).cast("B") if a.size else b""
                    info = [name, offset, a.nbytes, a.dtype.str, list(a.shape)]
                fh.write(view)
                offset += info[2]
                out.append(WriteResult(item.index, info[2], info))
            if self.sync_files:
                fh.flush()
                os.fsync(fh.fileno())
        return out

    def finish(self, metadata, results):
        metadata.version = CURRENT_DCP_VERSION
        metadata.storage_data = {r.index: r.storage_data for rs in results for r in rs}
        metadata.storage_meta = self.storage_meta()
        final = self._own_metadata()
        # the commit: readers see the old or the new checkpoint
        with atomic_write(final, sync=self.sync_files, tag=f"-{self.save_id[:8]}") as fh:
            distgrad.save({"format": _FORMAT, "metadata": metadata_to_data(metadata)}, fh)
        self._remove_unnamed({info[0] for info in metadata.storage_data.values()})

    def _remove_unnamed(self, named):
        """Data files (of this writer's ranks) that the committed metadata does not name."""
        mine = None if self.use_collectives or self.rank is None else str(self.rank)
        for entry in os.listdir(self.path):
            m = _DATA_FILE.match(entry)
            if m and entry not in named and (mine is None or m.group(1) == mine):
                try:
                    os.unlink(os.path.join(self.path, entry))
                except OSError:
                    pass

    # -- async_save's staging: a private copy of every tensor --
    def stage(self, state_dict):
        return _staged_copy(state_dict)


def _staged_copy(state_dict):
    flat, mapping = flatten_state_dict(state_dict)
    return unflatten_state_dict({k: wrap(array_of(v).copy()) if isinstance(v, Tensor) else v
                                 for k, v in flat.items()}, mapping)


class FileSystemReader(_Directory, StorageReader):
    def __init__(self, path, _extension_registry=None):
        if _extension_registry is not None:
            raise NotImplementedError("FileSystemReader: stream transform extensions are not "
                                      "supported by distgrad")
        self.path = os.fspath(path)
        self.storage_data = {}
        self.load_id = uuid.uuid4().hex
        self.rank = None

    def reset(self, checkpoint_id=None):
        self.storage_data = {}
        self._move_to(checkpoint_id)
        self.load_id = uuid.uuid4().hex

    def read_metadata(self, *args, **kwargs):
        """The checkpoint's metadata; ``rank=N`` reads the one rank N wrote alone (a save
        with ``use_collectives=False``)."""
        path = os.path.join(self.path, _metadata_name(kwargs.get("rank")))
        try:
            data = distgrad.load(path)
        except FileNotFoundError:
            raise FileNotFoundError(self._missing(kwargs.get("rank"))) from None
        if not isinstance(data, dict) or data.get("format") != _FORMAT:
            raise RuntimeError(f"{path} is not the metadata of a distgrad distributed checkpoint")
        metadata = metadata_from_data(data["metadata"])
        metadata.storage_meta = metadata.storage_meta or StorageMeta()
        metadata.storage_meta.load_id = self.load_id
        return metadata

    def _missing(self, rank):
        try:
            entries = os.listdir(self.path)
        except OSError:
            return f"no checkpoint at {self.path!r}: the directory does not exist"
        local = sorted(int(m.group(1)) for m in map(re.compile(r"^__(\d+)\.metadata$").match,
                                                    entries) if m)
        if rank is not None and local:
            return (f"no checkpoint for rank {rank} at {self.path!r}: it was saved without "
                    f"collectives by ranks {local}, and each rank reads its own metadata, so it "
                    "loads only onto the ranks that saved it (save with use_collectives=True "
                    "to load onto another world size)")
        return (f"no complete checkpoint at {self.path!r}: it has no {_METADATA} file (a save "
                "writes it last, so a save that did not finish leaves none)")

    def set_up_storage_reader(self, metadata, is_coordinator, *args, **kwargs):
        self.storage_data = metadata.storage_data
        self.rank = kwargs.get("rank")
        if self.storage_data is None:
            raise RuntimeError(f"the metadata of {self.path!r} says nothing of where its data is")

    def prepare_local_plan(self, plan):
        return plan

    def prepare_global_plan(self, plans):
        return plans

    def read_data(self, plan, planner):
        by_file = {}
        for item in plan.items:
            info = self.storage_data.get(item.storage_index)
            if info is None:
                raise RuntimeError(f"the checkpoint at {self.path!r} names no data for "
                                   f"{item.storage_index.fqn!r}")
            by_file.setdefault(info[0], []).append((info, item))
        for name, reads in by_file.items():
            with open(os.path.join(self.path, name), "rb") as fh:
                for info, item in sorted(reads, key=lambda r: r[0][1]):
                    self._read_item(fh, info, item, planner)
        fut = Future()
        fut.set_result(None)
        return fut

    def _read_item(self, fh, info, item, planner):
        fh.seek(info[1])
        if item.type == LoadItemType.BYTE_IO:
            planner.load_bytes(item, io.BytesIO(fh.read(info[2])))
            return
        stored_dtype, stored_shape = np.dtype(info[3]), tuple(info[4])
        target = planner.resolve_tensor(item)
        dest = array_of(target)
        whole = not any(item.storage_offsets) and tuple(item.lengths) == stored_shape
        if whole and dest.dtype == stored_dtype and dest.flags.c_contiguous \
                and dest.flags.writeable and dest.shape == stored_shape:
            if dest.nbytes and fh.readinto(memoryview(dest).cast("B")) != dest.nbytes:
                raise RuntimeError(f"{_name_of(fh)} ends inside {item.storage_index.fqn!r}")
            bump_version(target)
        else:
            src = np.fromfile(fh, dtype=stored_dtype, count=int(np.prod(stored_shape)))
            if src.size != int(np.prod(stored_shape)):
                raise RuntimeError(f"{_name_of(fh)} ends inside {item.storage_index.fqn!r}")
            src = src.reshape(stored_shape)[tuple(
                slice(o, o + n) for o, n in zip(item.storage_offsets, item.lengths))]
            with no_grad():
                target.copy_(wrap(np.ascontiguousarray(src)))
        planner.commit_tensor(item, target)


def _name_of(fh):
    return getattr(fh, "name", "the checkpoint file")


def storage_setup(storage, checkpoint_id, reader):
    """The storage ``save``/``load`` use: the one given (moved to ``checkpoint_id`` when
    one is given too), else a file-system one for a path ``checkpoint_id``."""
    if storage:
        if checkpoint_id is not None:
            storage.reset(checkpoint_id)
        return storage
    if not checkpoint_id:
        raise RuntimeError("`checkpoint_id` must be specified if storage_reader/storage_writer "
                           "is None.")
    cls = FileSystemReader if reader else FileSystemWriter
    if not cls.validate_checkpoint_id(checkpoint_id):
        raise RuntimeError("Cannot detect which StorageReader or StorageWriter to use. Please "
                           "specify the storage_reader/storage_writer.")
    storage = cls(checkpoint_id)
    storage.reset(checkpoint_id)
    return storage

"""Read a ``distgrad launch`` checkpoint through the distributed checkpoint API.

A launch checkpoint is one file per pipeline stage plus a manifest
(:mod:`distgrad.launch.checkpoint`); :class:`LaunchCheckpointReader` presents it as one
DCP checkpoint of the *whole* model, so a model built in one process (or on any
number of ranks) loads it with ``dcp.load``::

    model = mlp([2, 8, 8, 2])                  # the config's factory, whole
    optim = distgrad.optim.SGD(model.parameters(), lr=0.05)
    msd, osd = get_state_dict(model, optim)
    state = {"model": msd, "optim": osd, "step": 0}
    dcp.load(state, storage_reader=LaunchCheckpointReader("runs/tiny-.../checkpoints/step-00000006"))
    set_state_dict(model, optim, model_state_dict=state["model"], optim_state_dict=state["optim"])

Keys: ``model.<name>`` (the whole model's parameter and buffer names: a stage's
slice keeps them), ``optim.state.<name>.<state>`` and ``optim.param_groups.<stage>.*``
(the layout of ``get_optimizer_state_dict``, one group per stage), ``step``, and
``rng.<stage>``. Launch keeps writing its own format: its stages are separate
processes that meet over RPC, not ranks of one process group, its manifest already
commits a checkpoint after every stage's file is on disk, and its resumes are
bit-exact; a reader gives DCP's API without touching that.
"""
import io
import os

import distgrad
from distgrad.autograd.tensor import Size, Tensor
from distgrad.distributed.checkpoint import StorageReader
from distgrad.distributed.checkpoint.nested_dict import flatten_state_dict
from distgrad.distributed.checkpoint.default_planner import narrow_tensor_by_index
from distgrad.distributed.checkpoint.metadata import (BytesStorageMetadata, ChunkStorageMetadata,
                                                      Metadata, MetadataIndex, TensorProperties,
                                                      TensorStorageMetadata)
from distgrad.distributed.checkpoint.planner import LoadItemType
from distgrad.futures import Future

from . import checkpoint as ckpt

__all__ = ["LaunchCheckpointReader"]


def _optimizer_by_name(state, where):
    names = state.get("param_names")
    if names is None:
        raise RuntimeError(f"{where} predates parameter names in launch checkpoints: its "
                           "optimizer state is by position only and cannot be read by name")
    osd = state["optimizer"]
    return ({names[i]: v for i, v in osd["state"].items()},
            [{**g, "params": [names[i] for i in g["params"]]} for g in osd["param_groups"]])


class LaunchCheckpointReader(StorageReader):
    """``checkpoint_id``: a checkpoint directory (``.../checkpoints/step-N``) or a run
    directory (its latest complete checkpoint)."""

    def __init__(self, checkpoint_id=None):
        self.checkpoint_id = None if checkpoint_id is None else os.fspath(checkpoint_id)
        self.values = None

    def reset(self, checkpoint_id=None):
        if checkpoint_id is not None:
            self.checkpoint_id = os.fspath(checkpoint_id)
        self.values = None

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id):
        path = os.fspath(checkpoint_id)
        return os.path.exists(os.path.join(path, ckpt.MANIFEST)) or ckpt.latest(path) is not None

    def _directory(self):
        if self.checkpoint_id is None:
            raise RuntimeError("LaunchCheckpointReader: no checkpoint_id given")
        if os.path.exists(os.path.join(self.checkpoint_id, ckpt.MANIFEST)):
            return self.checkpoint_id
        found = ckpt.latest(self.checkpoint_id)
        if found is None:
            raise FileNotFoundError(f"{self.checkpoint_id!r} is neither a complete launch "
                                    "checkpoint (no manifest) nor a run directory that has one")
        return found[0]

    def read_metadata(self, *args, **kwargs):
        directory = self._directory()
        manifest = ckpt.read_manifest(directory)
        nested = {"model": {}, "optim": {"state": {}, "param_groups": []},
                  "step": int(manifest["step"]), "rng": {}}
        for k in range(int(manifest["stages"])):
            path = ckpt.stage_path(directory, k)
            state = distgrad.load(path)
            nested["model"].update(state["model"])
            by_name, groups = _optimizer_by_name(state, path)
            nested["optim"]["state"].update(by_name)
            nested["optim"]["param_groups"].extend(groups)
            nested["rng"][str(k)] = state["rng"]
        self.values, mappings = flatten_state_dict(nested)
        md = {}
        storage = {}
        for key, value in self.values.items():
            if isinstance(value, Tensor):
                size = Size(value.shape)
                zero = Size([0] * len(size))
                md[key] = TensorStorageMetadata(TensorProperties.create_from_tensor(value), size,
                                                [ChunkStorageMetadata(zero, size)])
                storage[MetadataIndex(key, zero)] = key
            else:
                md[key] = BytesStorageMetadata()
                storage[MetadataIndex(key)] = key
        return Metadata(md, planner_data=mappings, storage_data=storage)

    def set_up_storage_reader(self, metadata, is_coordinator, *args, **kwargs):
        if self.values is None:
            self.read_metadata()

    def prepare_local_plan(self, plan):
        return plan

    def prepare_global_plan(self, plans):
        return plans

    def read_data(self, plan, planner):
        for item in plan.items:
            value = self.values[item.storage_index.fqn]
            if item.type == LoadItemType.BYTE_IO:
                buf = io.BytesIO()
                distgrad.save(value, buf)
                buf.seek(0)
                planner.load_bytes(item, buf)
                continue
            src = narrow_tensor_by_index(value, item.storage_offsets, item.lengths)
            target = planner.resolve_tensor(item)
            with distgrad.no_grad():
                target.copy_(src)
            planner.commit_tensor(item, target)
        fut = Future()
        fut.set_result(None)
        return fut

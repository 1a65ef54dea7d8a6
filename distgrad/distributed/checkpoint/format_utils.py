"""Between DCP checkpoints and single files of ``distgrad.save`` (PyTorch's "torch save"
format's counterpart): ``dcp_to_torch_save``, ``torch_save_to_dcp``, and a reader that
loads a ``distgrad.save`` file onto every rank through ``load``
(``BroadcastingTorchSaveReader`` with ``DynamicMetaLoadPlanner``).

    python -m distgrad.distributed.checkpoint.format_utils dcp_to_torch ckpt/ model.pt
"""
import argparse
import os

import distgrad
from distgrad.autograd.tensor import Size, Tensor
from distgrad.futures import Future
from distgrad.ops.creation import empty_like

from ..collectives import broadcast
from ..process_group import get_rank, is_initialized
from .nested_dict import flatten_state_dict
from .default_planner import DefaultLoadPlanner, _EmptyStateDictLoadPlanner, narrow_tensor_by_index
from .filesystem import FileSystemReader, FileSystemWriter
from .metadata import ChunkStorageMetadata, Metadata, TensorProperties, TensorStorageMetadata
from .planner import LoadItemType
from .state_dict_loader import _load_state_dict
from .state_dict_saver import _save_state_dict
from .storage import StorageReader

__all__ = ["dcp_to_torch_save", "torch_save_to_dcp", "BroadcastingTorchSaveReader",
           "DynamicMetaLoadPlanner"]


def dcp_to_torch_save(dcp_checkpoint_dir, torch_save_path):
    """Write the whole checkpoint in ``dcp_checkpoint_dir`` as one ``distgrad.save`` file
    (nested as it was saved). Run it on one rank: it holds everything in memory."""
    sd = {}
    _load_state_dict(sd, FileSystemReader(dcp_checkpoint_dir),
                     planner=_EmptyStateDictLoadPlanner(), no_dist=True)
    distgrad.save(sd, torch_save_path)


def torch_save_to_dcp(torch_save_path, dcp_checkpoint_dir):
    """Write the state dict in a ``distgrad.save`` file as a DCP checkpoint (this process
    alone). The file is trusted as ``torch.load(weights_only=False)`` trusts it: classes of
    modules already imported may be named in it."""
    state_dict = distgrad.load(torch_save_path, weights_only=False)
    _save_state_dict(state_dict, FileSystemWriter(dcp_checkpoint_dir), no_dist=True)


class BroadcastingTorchSaveReader(StorageReader):
    """Reads a ``distgrad.save`` file on the coordinator rank only and broadcasts each
    tensor to the others. Use it with :class:`DynamicMetaLoadPlanner`; tensors only."""

    def __init__(self, checkpoint_id=None, coordinator_rank=0):
        self.checkpoint_id = checkpoint_id
        self.coordinator_rank = coordinator_rank

    def read_metadata(self, *args, **kwargs):
        return Metadata(state_dict_metadata={})  # the planner makes it from the state dict

    def set_up_storage_reader(self, metadata, is_coordinator, *args, **kwargs):
        self.is_coordinator = is_coordinator
        if self.checkpoint_id is None:
            raise RuntimeError("BroadcastingTorchSaveReader: checkpoint_id must be set before "
                               "loading")

    def read_data(self, plan, planner):
        source = None
        if self.is_coordinator:
            source = distgrad.load(self.checkpoint_id, weights_only=False)
            if planner.flatten_state_dict:
                source, _ = flatten_state_dict(source)
        for req in plan.items:
            if req.type == LoadItemType.BYTE_IO:
                raise RuntimeError(f"Non-tensor value identified at {req.storage_index.fqn}. At "
                                   f"this time {type(self).__name__} only supports loading "
                                   "Tensors.")
            fqn = req.storage_index.fqn
            if self.is_coordinator:
                if fqn not in source:
                    raise RuntimeError(f"{self.checkpoint_id} holds no {fqn!r}")
                tensor = source[fqn].detach().clone()
            else:
                tensor = empty_like(planner.state_dict[fqn])
            if is_initialized():
                broadcast(tensor, src=self.coordinator_rank)
            tensor = narrow_tensor_by_index(tensor, req.storage_offsets, req.lengths)
            target = planner.resolve_tensor(req)
            if Size(target.shape) != Size(tensor.shape):
                raise RuntimeError(f"{fqn}: the file holds {list(tensor.shape)}, the state dict "
                                   f"{list(target.shape)}")
            with distgrad.no_grad():
                target.copy_(tensor)
            planner.commit_tensor(req, target)
        fut = Future()
        fut.set_result(None)
        return fut

    def prepare_local_plan(self, plan):
        return plan

    def prepare_global_plan(self, global_plan):
        return global_plan

    def reset(self, checkpoint_id=None):
        self.checkpoint_id = checkpoint_id

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id):
        return os.path.isfile(checkpoint_id)


class DynamicMetaLoadPlanner(DefaultLoadPlanner):
    """A load planner whose metadata is the state dict's own (every key a whole tensor),
    for files without DCP metadata: :class:`BroadcastingTorchSaveReader`."""

    def set_up_planner(self, state_dict, metadata=None, is_coordinator=False):
        super().set_up_planner(state_dict, metadata, is_coordinator)
        md = {}
        for key, tensor in self.state_dict.items():
            if not isinstance(tensor, Tensor):
                raise RuntimeError(f"Non-tensor value identified at {key}. At this time "
                                   f"{type(self).__name__} only supports loading Tensors.")
            size = Size(tensor.shape)
            md[key] = TensorStorageMetadata(TensorProperties(dtype=tensor.dtype), size,
                                            [ChunkStorageMetadata(Size([0] * len(size)), size)])
        self.metadata = Metadata(state_dict_metadata=md)


def _main(argv=None):
    parser = argparse.ArgumentParser(description="convert between DCP checkpoints and "
                                                 "distgrad.save files")
    parser.add_argument("mode", choices=["torch_to_dcp", "dcp_to_torch"])
    parser.add_argument("src")
    parser.add_argument("dst")
    args = parser.parse_args(argv)
    print(f"Converting checkpoint from {args.src} to {args.dst} using method: '{args.mode}'")
    exists = os.path.isfile if args.mode == "torch_to_dcp" else os.path.isdir
    if not exists(args.src):
        print(f"No checkpoint found at {args.src}. Skipping conversion.")
        return
    (torch_save_to_dcp if args.mode == "torch_to_dcp" else dcp_to_torch_save)(args.src, args.dst)


if __name__ == "__main__":
    _main()

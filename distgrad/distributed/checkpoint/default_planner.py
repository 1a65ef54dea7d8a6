"""``DefaultSavePlanner`` and ``DefaultLoadPlanner`` (``torch.distributed.checkpoint.
default_planner``): nested state dicts are flattened to dotted keys; a tensor is one
item (a chunk covering it), any other value one bytes item (``distgrad.save``'s
format, never pickle).

Replicated state (a DDP model's parameters, the same on every rank) is written
once: the global plan keeps each item on the rank that has planned the fewest bytes
so far (or the lowest rank, ``dedup_save_to_lowest_rank``), so two ranks each write
about half. Loading needs no rank to have saved anything in particular: each rank
reads what its state dict asks for from whichever file holds it, so a checkpoint of
replicated state loads onto any number of ranks.
"""
import dataclasses
import io
import logging
from collections import ChainMap, defaultdict

import distgrad
from distgrad.autograd.tensor import Size, Tensor

from .nested_dict import flatten_state_dict, set_element
from .metadata import (BytesStorageMetadata, ChunkStorageMetadata, Metadata, MetadataIndex,
                       TensorProperties, TensorStorageMetadata)
from .planner import (BytesIOWriteData, LoadItemType, LoadPlan, LoadPlanner, ReadItem, SavePlan,
                      SavePlanner, TensorWriteData, WriteItem, WriteItemType)

__all__ = ["DefaultSavePlanner", "DefaultLoadPlanner", "create_default_local_load_plan",
           "create_default_global_load_plan", "create_default_local_save_plan",
           "create_default_global_save_plan", "dedup_save_plans", "find_state_dict_object",
           "narrow_tensor_by_index"]

logger = logging.getLogger(__name__)


# ------------------------------------------------------------------ items
def _write_items(fqn, obj):
    if isinstance(obj, Tensor):
        size = Size(obj.shape)
        return [WriteItem(MetadataIndex(fqn, [0] * len(size)), WriteItemType.TENSOR,
                          tensor_data=TensorWriteData(ChunkStorageMetadata(Size([0] * len(size)),
                                                                           size),
                                                      TensorProperties.create_from_tensor(obj),
                                                      size))]
    return [WriteItem(MetadataIndex(fqn), WriteItemType.BYTE_IO, bytes_io_data=BytesIOWriteData(0))]


def _read_items(fqn, md, obj):
    if isinstance(md, BytesStorageMetadata):
        return [ReadItem(LoadItemType.BYTE_IO, MetadataIndex(fqn), Size([0]), MetadataIndex(fqn),
                         Size([0]), Size([0]))]
    if not isinstance(obj, Tensor):
        raise RuntimeError(f"the checkpoint holds a tensor at {fqn!r}, but the state_dict has "
                           f"a {type(obj).__name__} there (load needs a tensor of shape "
                           f"{list(md.size)} to fill)")
    out = []
    dest = Size(obj.shape)
    for i, chunk in enumerate(md.chunks):
        # the overlap of the stored box with the whole destination tensor (a load
        # wants every element; several stored chunks may each hold a part)
        lo = [max(o, 0) for o in chunk.offsets]
        hi = [min(o + s, d) for o, s, d in zip(chunk.offsets, chunk.sizes, dest)]
        if any(h <= l for l, h in zip(lo, hi)) and len(dest):
            continue
        out.append(ReadItem(LoadItemType.TENSOR, MetadataIndex(fqn, [0] * len(dest)), Size(lo),
                            MetadataIndex(fqn, chunk.offsets, i),
                            Size([l - o for l, o in zip(lo, chunk.offsets)]),
                            Size([h - l for l, h in zip(lo, hi)])))
    return out


def find_state_dict_object(state_dict, index):
    if index.fqn not in state_dict:
        raise ValueError(f"Could not find FQN: '{index.fqn}'")
    obj = state_dict[index.fqn]
    if isinstance(obj, Tensor) and index.offset is not None and any(index.offset):
        raise ValueError(f"Invalid offset {list(index.offset)} for {index.fqn!r}: the state "
                         "dict holds the whole tensor, whose only chunk starts at 0")
    return obj


def narrow_tensor_by_index(tensor, offsets, sizes):
    for dim, (o, s) in enumerate(zip(offsets, sizes)):
        if s < tensor.shape[dim]:
            tensor = tensor.narrow(dim, o, s)
    return tensor


# ------------------------------------------------------------------ plans
def create_default_local_save_plan(state_dict, is_coordinator):
    """One item per value; every rank plans everything, the global plan dedups."""
    items = []
    for fqn, obj in state_dict.items():
        items += _write_items(fqn, obj)
    return SavePlan(items)


def dedup_save_plans(all_plans, save_to_lowest_rank=False):
    """Keep each item (same index on several ranks: replicated) in one plan only."""
    holders, item_of = defaultdict(list), {}
    for k, plan in enumerate(all_plans):
        for item in plan.items:
            holders[item.index].append(k)
            first = item_of.setdefault(item.index, item)
            if _layout(first) != _layout(item):
                # one key, different tensors: not replicated state, and keeping either
                # copy would lose the other without a word
                raise ValueError(
                    f"{item.index.fqn!r} differs between ranks {holders[item.index][0]} and "
                    f"{k} ({_layout(first)} vs {_layout(item)}): a key saved by several ranks "
                    "must hold the same (replicated) value on each; give per-rank state "
                    "per-rank keys")
    planned = [0] * len(all_plans)
    keep = [set() for _ in all_plans]
    for index, ranks in holders.items():
        k = min(ranks) if save_to_lowest_rank else min(ranks, key=lambda r: planned[r])
        planned[k] += item_of[index].tensor_storage_size() or 1
        keep[k].add(index)
    return [dataclasses.replace(p, items=[i for i in p.items if i.index in kept])
            for p, kept in zip(all_plans, keep)]


def _layout(item):
    t = item.tensor_data
    return "bytes" if t is None else f"{t.properties.dtype} {list(t.size)}"


def create_default_global_save_plan(all_plans, rewrite_index_hints=True):
    """The plans (with index hints) and the :class:`Metadata` of all their items."""
    md, new_plans = {}, []
    for plan in all_plans:
        items = []
        for item in plan.items:
            if item.type != WriteItemType.SHARD and item.index.fqn in md:
                raise ValueError(f"the plans write {item.index.fqn!r} twice")
            if item.type == WriteItemType.BYTE_IO:
                md[item.index.fqn] = BytesStorageMetadata()
                items.append(item)
                continue
            t = item.tensor_data
            tmd = md.setdefault(item.index.fqn, TensorStorageMetadata(t.properties, t.size, []))
            if rewrite_index_hints:
                item = dataclasses.replace(
                    item, index=dataclasses.replace(item.index, index=len(tmd.chunks)))
            tmd.chunks.append(t.chunk)
            items.append(item)
        new_plans.append(dataclasses.replace(plan, items=items))
    return new_plans, Metadata(md)


def _validate_global_plan(metadata):
    """Every tensor's chunks lie inside it and together cover it exactly once."""
    errors = []
    for fqn, md in metadata.state_dict_metadata.items():
        if not isinstance(md, TensorStorageMetadata):
            continue
        total = 1
        for s in md.size:
            total *= s
        covered = 0
        for c in md.chunks:
            if any(o < 0 or o + s > d for o, s, d in zip(c.offsets, c.sizes, md.size)):
                errors.append(f"{fqn}: chunk at {list(c.offsets)} of {list(c.sizes)} lies "
                              f"outside the tensor of {list(md.size)}")
            n = 1
            for s in c.sizes:
                n *= s
            covered += n
        if covered != total:
            errors.append(f"{fqn}: chunks hold {covered} elements of {total}")
    return errors


def create_default_local_load_plan(state_dict, metadata, strict=True):
    requests = []
    for fqn, obj in state_dict.items():
        if fqn not in metadata.state_dict_metadata:
            if strict:
                raise RuntimeError(f"Missing key in checkpoint state_dict: {fqn}.")
            continue
        md = metadata.state_dict_metadata[fqn]
        if isinstance(md, TensorStorageMetadata) and isinstance(obj, Tensor) \
                and Size(obj.shape) != md.size:
            raise ValueError(f"Size mismatch between saved {md.size} and current: "
                             f"{Size(obj.shape)} for {fqn}")
        requests += _read_items(fqn, md, obj)
    return LoadPlan(requests)


def create_default_global_load_plan(all_plans):
    return all_plans


# ------------------------------------------------------------------ planners
class DefaultSavePlanner(SavePlanner):
    def __init__(self, flatten_state_dict=True, flatten_sharded_tensors=True,
                 dedup_replicated_tensors=None, dedup_save_to_lowest_rank=False,
                 enable_plan_caching=False):
        self.flatten_state_dict = flatten_state_dict
        self.flatten_sharded_tensors = flatten_sharded_tensors
        self.dedup_save_to_lowest_rank = dedup_save_to_lowest_rank
        self.enable_plan_caching = enable_plan_caching  # plans are cheap to make here
        self.mappings = {}
        if dedup_replicated_tensors is not None:
            logger.warning("DefaultSavePlanner's `dedup_replicated_tensors` argument is "
                           "deprecated and has no effect")

    def set_up_planner(self, state_dict, storage_meta=None, is_coordinator=False):
        if self.flatten_state_dict:
            state_dict, self.mappings = flatten_state_dict(state_dict)
        self.state_dict = state_dict
        self.is_coordinator = is_coordinator

    def create_local_plan(self):
        plan = create_default_local_save_plan(self.state_dict, self.is_coordinator)
        if self.flatten_state_dict:
            plan = dataclasses.replace(plan, planner_data=self.mappings)
        self.plan = plan
        return plan

    def _dedup_save_plans(self, all_plans):
        return dedup_save_plans(all_plans, self.dedup_save_to_lowest_rank)

    def create_global_plan(self, all_plans):
        plans, metadata = create_default_global_save_plan(self._dedup_save_plans(all_plans))
        if self.flatten_state_dict:
            merged = dict(ChainMap(*[p.planner_data for p in plans if p.planner_data]))
            metadata = dataclasses.replace(metadata, planner_data=merged)
        errors = _validate_global_plan(metadata)
        if errors:
            raise ValueError("Failed to validate global plan: " + "; ".join(errors)[:500])
        self.global_plan, self.metadata = plans, metadata
        return plans, metadata

    def finish_plan(self, new_plan):
        self.plan = new_plan
        return new_plan

    def resolve_data(self, write_item):
        return self.transform_object(write_item, self.lookup_object(write_item.index))

    def lookup_object(self, index):
        """The value ``index`` names (subclasses override to map keys)."""
        return find_state_dict_object(self.state_dict, index)

    def transform_object(self, write_item, object):  # noqa: A002 - PyTorch's name
        """Non-tensor values become a ``io.BytesIO`` in ``distgrad.save``'s format."""
        if write_item.type == WriteItemType.BYTE_IO:
            buf = io.BytesIO()
            distgrad.save(object, buf)
            buf.seek(0)
            return buf
        return object


class DefaultLoadPlanner(LoadPlanner):
    """``allow_partial_load``: keys of the state dict that the checkpoint lacks are left as
    they are instead of raising."""

    def __init__(self, flatten_state_dict=True, flatten_sharded_tensors=True,
                 allow_partial_load=False):
        self.flatten_state_dict = flatten_state_dict
        self.flatten_sharded_tensors = flatten_sharded_tensors
        self.allow_partial_load = allow_partial_load
        self.original_state_dict = {}
        self.mappings = {}

    def set_up_planner(self, state_dict, metadata=None, is_coordinator=False):
        self.original_state_dict = state_dict
        if self.flatten_state_dict:
            state_dict, self.mappings = flatten_state_dict(state_dict)
        self.state_dict = state_dict
        self.metadata = metadata
        self.is_coordinator = is_coordinator

    def create_local_plan(self):
        return create_default_local_load_plan(self.state_dict, self.metadata,
                                              not self.allow_partial_load)

    def create_global_plan(self, global_plan):
        return create_default_global_load_plan(global_plan)

    def finish_plan(self, new_plan):
        return new_plan

    def load_bytes(self, read_item, value):
        obj = distgrad.load(value)
        if self.flatten_state_dict:
            set_element(self.original_state_dict, self.mappings[read_item.dest_index.fqn], obj)
        else:
            self.state_dict[read_item.dest_index.fqn] = obj

    def resolve_tensor(self, read_item):
        return self.transform_tensor(read_item, self.lookup_tensor(read_item.dest_index))

    def commit_tensor(self, read_item, tensor):
        pass

    def lookup_tensor(self, index):
        return find_state_dict_object(self.state_dict, index)

    def transform_tensor(self, read_item, tensor):
        return narrow_tensor_by_index(tensor, read_item.dest_offsets, read_item.lengths)


class _EmptyStateDictLoadPlanner(DefaultLoadPlanner):
    """Builds the state dict from the checkpoint's metadata (tensors allocated empty), for
    reading a checkpoint without a model: ``dcp_to_torch_save``. ``keys`` limits it to
    those keys (or their prefixes)."""

    def __init__(self, keys=None, *args, **kwargs):
        self.keys = keys
        super().__init__(*args, **kwargs)

    def _should_include_key(self, key, metadata):
        if self.keys is None or key in self.keys:
            return True
        path = (metadata.planner_data or {}).get(key, ())
        return any(".".join(map(str, path[:n])) in self.keys for n in range(1, len(path) + 1))

    def set_up_planner(self, state_dict, metadata=None, is_coordinator=False):
        if state_dict:
            raise ValueError("_EmptyStateDictLoadPlanner fills an empty state_dict")
        for key, md in metadata.state_dict_metadata.items():
            if not self._should_include_key(key, metadata):
                continue
            value = distgrad.empty(*md.size, dtype=md.properties.dtype) \
                if isinstance(md, TensorStorageMetadata) else md
            if metadata.planner_data is not None and key in metadata.planner_data:
                set_element(state_dict, tuple(metadata.planner_data[key]), value)
            else:
                state_dict[key] = value
        super().set_up_planner(state_dict, metadata, is_coordinator)

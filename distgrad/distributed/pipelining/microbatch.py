"""Splitting a batch into micro-batches and merging the outputs back
(``torch.distributed.pipelining.microbatch``).

>>> import distgrad
>>> x = distgrad.arange(10.).reshape(5, 2)
>>> chunks, _ = split_args_kwargs_into_chunks((x,), None, 2)
>>> [tuple(c[0].shape) for c in chunks]   # torch.tensor_split's sizes: the first is larger
[(3, 2), (2, 2)]
>>> bool((merge_chunks([c[0] for c in chunks], TensorChunkSpec(0)) == x).all())
True

Tensors are split along their spec's dimension (default 0) into as many pieces as the
smallest splittable size allows, at most ``chunks``; other values are given to every
micro-batch as they are.
"""
import operator

import distgrad
from distgrad.autograd import Tensor

from ._utils import tree_flatten, tree_map, tree_unflatten

__all__ = ["TensorChunkSpec", "split_args_kwargs_into_chunks", "merge_chunks"]

#: the dimension split when no spec says otherwise
DEFAULT_CHUNK_DIM = 0


class TensorChunkSpec:
    """How a tensor argument is split: along ``split_dim``."""

    def __init__(self, split_dim):
        self.split_dim = split_dim

    def __repr__(self):
        return f"{type(self).__module__}.{type(self).__name__}({self.split_dim})"

    def __str__(self):
        return f"TensorChunkSpec({self.split_dim})"

    @staticmethod
    def from_tuple(chunk_dims):
        """A spec per positional argument: ``from_tuple((0, 0, 1))``."""
        return tree_map(TensorChunkSpec, tuple(chunk_dims))

    @staticmethod
    def from_dict(chunk_dims):
        """A spec per keyword argument: ``from_dict({"id": 0, "mask": 1})``."""
        return tree_map(TensorChunkSpec, dict(chunk_dims))


class _Replicate:
    """A spec: the value goes whole to every micro-batch."""


class _CustomReducer:
    """A merge spec: outputs are folded with ``reduce_fn``, starting from ``init_value``."""

    def __init__(self, init_value, reduce_fn):
        self.init_value, self.reduce_fn = init_value, reduce_fn


class _LossReducer(_CustomReducer):
    pass


sum_reducer = _LossReducer(distgrad.tensor(0.0), operator.add)


def _chunk_sizes(length, n):
    """torch.tensor_split's sizes: the first ``length % n`` pieces one larger."""
    base, extra = divmod(length, n)
    return [base + 1 if i < extra else base for i in range(n)]


def _split_tensor(tensor, spec, num_chunks):
    """``tensor`` in ``num_chunks`` views along ``spec.split_dim``."""
    length = tensor.size(spec.split_dim)
    if length < num_chunks:
        raise AssertionError(f"Tensor size {length} is smaller than num_chunks")
    chunks = list(tensor.split(_chunk_sizes(length, num_chunks), spec.split_dim))
    if tensor.requires_grad and tensor.is_leaf:
        for c in chunks:  # views are not leaves: keep their .grad for the stage to read
            c.retain_grad()
    return chunks


def _is_replicate(spec):
    return spec is _Replicate or isinstance(spec, _Replicate)


def _shard_dict_of_args(args_dict, args_chunk_spec, num_chunks):
    """``num_chunks`` (or fewer, when a tensor is shorter) dicts of the split arguments."""
    if not args_dict:
        return [{} for _ in range(num_chunks)]
    if len(args_dict) != len(args_chunk_spec):
        raise AssertionError(f"args_dict.keys() = {list(args_dict)} args_chunk_spec.keys() = "
                             f"{list(args_chunk_spec)}")
    values, tree = tree_flatten(args_dict)
    specs, _ = tree_flatten(args_chunk_spec)
    if len(specs) != len(values):
        raise AssertionError(f"{len(values)} values but {len(specs)} chunk specs: the specs "
                             "must have the shape of the arguments")
    sizes = []
    for v, spec in zip(values, specs):
        if _is_replicate(spec):
            sizes.append(num_chunks)
        elif isinstance(v, Tensor) and isinstance(spec, TensorChunkSpec):
            sizes.append(v.size(spec.split_dim))
        else:
            raise ValueError(f"Unsupported chunk spec: {spec} and value: {v} combination.")
    n = min(min(sizes), num_chunks)
    pieces = [[v] * n if _is_replicate(spec) else _split_tensor(v, spec, n)
              for v, spec in zip(values, specs)]
    return [tree_unflatten([p[i] for p in pieces], tree) for i in range(n)]


def split_args_kwargs_into_chunks(args, kwargs, chunks, args_chunk_spec=None,
                                  kwargs_chunk_spec=None):
    """``(args of each micro-batch, kwargs of each micro-batch)``: ``chunks`` of them, or
    fewer when a tensor has fewer rows; without specs, tensors split along dimension 0 and
    other values are replicated."""
    kwargs = kwargs or {}

    def default(v):
        return TensorChunkSpec(DEFAULT_CHUNK_DIM) if isinstance(v, Tensor) else _Replicate()
    if args_chunk_spec is None:
        args_chunk_spec = tree_map(default, tuple(args))
    if kwargs_chunk_spec is None:
        kwargs_chunk_spec = tree_map(default, kwargs)
    positional = dict(enumerate(args))
    positional_specs = dict(enumerate(args_chunk_spec))
    args_split = _shard_dict_of_args(positional, positional_specs, chunks)
    n = len(args_split)
    kwargs_split = _shard_dict_of_args(kwargs, kwargs_chunk_spec, n)
    if len(kwargs_split) < n:  # a keyword tensor is shorter: split the positional ones again
        n = len(kwargs_split)
        args_split = _shard_dict_of_args(positional, positional_specs, n)
    if len(args_split) != len(kwargs_split):
        raise RuntimeError("args and kwargs are split into different number of chunks: "
                           f"{len(args_split)}, {len(kwargs_split)}")
    return [tuple(a[i] for i in range(len(a))) for a in args_split], kwargs_split


def merge_chunks(chunks, chunk_spec):
    """One value from the micro-batches' ``chunks``: tensors concatenated along their spec's
    dimension (default 0 for every tensor), reducers folded, other values checked equal."""
    if chunk_spec is not None:
        specs, _ = tree_flatten(chunk_spec)
    else:
        first, _ = tree_flatten(chunks[0])
        specs = [TensorChunkSpec(DEFAULT_CHUNK_DIM)] * len(first)
    flat = []
    tree = None
    for chunk in chunks:
        leaves, tree = tree_flatten(chunk)
        if len(leaves) != len(specs):
            raise ValueError(f"Chunk {chunk} did not match chunk spec {chunk_spec}")
        flat.append(leaves)
    merged = []
    for i, spec in enumerate(specs):
        values = [leaves[i] for leaves in flat]
        if isinstance(spec, TensorChunkSpec):
            merged.append(distgrad.cat(values, dim=spec.split_dim))
        elif isinstance(spec, _CustomReducer):
            acc = spec.init_value
            for v in values:
                acc = spec.reduce_fn(acc, v)
            merged.append(acc)
        else:
            for v in values[1:]:
                if not _same(v, values[0]):
                    raise AssertionError(f"Expected {values[0]}, got {v}")
            merged.append(values[0])
    return tree_unflatten(merged, tree if chunk_spec is None else tree_flatten(chunk_spec)[1])


def _same(a, b):
    if isinstance(a, Tensor) or isinstance(b, Tensor):
        return isinstance(a, Tensor) and isinstance(b, Tensor) and a.shape == b.shape and \
            bool((a == b).all())
    return a == b

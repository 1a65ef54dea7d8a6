"""Indexing and selection: ``x[key]``, ``x[key] = v``, index_select, gather, where,
maximum/minimum, masked_fill.

Basic indexing (ints, slices, None, Ellipsis) returns a view; advanced indexing
copies, and its gradient accumulates over repeated indices.
"""
from collections import namedtuple

import numpy as np

from ..autograd.tensor import TensorBase
from .promotion import operands, as_tensor_operand
from ..autograd._internal import array_of, wrap, wrap_dim, defop, record, record_view

__all__ = ["getitem", "index_put", "index_select", "gather", "where", "maximum", "minimum",
           "masked_fill", "masked_select", "tril", "triu", "take_along_dim", "fmax", "fmin",
           "sort", "argsort", "topk"]


def convert_key(key):
    """Turn Tensors inside an index into ndarrays; say whether the index is basic."""
    if not isinstance(key, tuple):
        key = (key,)
    out = []
    basic = True
    for k in key:
        if isinstance(k, TensorBase):
            k = array_of(k)
            if k.dtype.kind not in "biu":
                raise IndexError("tensors used as indices must be long, int, byte or bool tensors")
        if isinstance(k, (bool, np.bool_)):
            k = np.asarray(k)
        elif isinstance(k, range):  # a sequence of indices, as PyTorch takes it
            k = np.arange(k.start, k.stop, k.step, dtype=np.int64)
        if isinstance(k, (np.ndarray, list)):
            basic = False
            arr = np.asarray(k)
            if arr.dtype.kind not in "biu" and arr.size:
                raise IndexError("tensors used as indices must be long, int, byte or bool tensors")
            k = arr if arr.size else arr.astype(np.int64)
        elif not (k is None or k is Ellipsis or isinstance(k, (int, np.integer, slice))):
            raise IndexError(f"only integers, slices (`:`), ellipsis (`...`), None and long or "
                             f"byte Variables are valid indices (got {type(k).__name__})")
        out.append(k)
    return tuple(out), basic


def _index_grad(xp, g, m):
    return xp.index_add(m["shape"], m["key"], g, m["accumulate"])


SliceBackward0 = defop("SliceBackward0", vjps=(_index_grad,))
SelectBackward0 = defop("SelectBackward0", vjps=(_index_grad,))
IndexBackward0 = defop("IndexBackward0", vjps=(_index_grad,))


def _tensors_in(key):
    """The tensors of an index (their arrays are part of the converted key)."""
    return tuple(k for k in (key if isinstance(key, tuple) else (key,))
                 if isinstance(k, TensorBase))


def getitem(input, key, kept=()):
    """``input[key]``; ``kept``: tensors the key was made from (their arrays are in it)."""
    d = array_of(input)
    key_tensors = key
    key, basic = convert_key(key)
    try:
        out = d[key]
    except IndexError as exc:
        raise IndexError(f"{exc} (indexing a tensor of shape {list(d.shape)})") from None
    meta = {"shape": d.shape, "key": key, "accumulate": not basic}
    if basic:
        node = SelectBackward0 if all(isinstance(k, (int, np.integer)) for k in key) else SliceBackward0
        return record_view(node, out, input, meta, lambda a, k=key: a[k])
    return record(IndexBackward0, np.ascontiguousarray(out), (input,), (), meta,
                  kept=_tensors_in(key_tensors) + tuple(kept))


def _put_self_vjp(xp, g, m):
    return xp.index_put_zero(g, m["key"])


def _put_values_vjp(xp, g, m):
    return xp.take(g, m["key"])


IndexPutBackward0 = defop("IndexPutBackward0", vjps=(_put_self_vjp, _put_values_vjp))


def index_put(input, key, values):
    """Out-of-place ``input[key] = values`` (the recorded half of ``__setitem__``)."""
    d = array_of(input)
    key_tensors = key
    if isinstance(key, tuple) or not isinstance(key, (list,)):
        key, _ = convert_key(key)
    v = as_tensor_operand(values, input)
    out = d.copy()
    try:
        out[key] = array_of(v)
    except ValueError as exc:
        raise RuntimeError(f"shape mismatch: value tensor of shape {list(array_of(v).shape)} cannot "
                           f"be broadcast to indexing result of shape "
                           f"{list(d[key].shape)}") from exc
    return record(IndexPutBackward0, out, (input, v), (), {"key": key},
                  kept=_tensors_in(key_tensors))


def index_select(input, dim, index):
    d = array_of(input)
    dim = wrap_dim(dim, d.ndim)
    idx = array_of(index) if isinstance(index, TensorBase) else np.asarray(index)
    if idx.ndim > 1:
        raise IndexError("index_select(): Index is supposed to be a vector")
    key = (slice(None),) * dim + (idx.reshape(-1),)
    out = d[key]
    return record(IndexSelectBackward0, np.ascontiguousarray(out),
                  (input,), (), {"shape": d.shape, "key": key, "accumulate": True, "dim": dim},
                  kept=(index,))


IndexSelectBackward0 = defop("IndexSelectBackward0", vjps=(_index_grad,))


def _gather_vjp(xp, g, m):
    return xp.scatter_add_along(m["shape"], m["index"], g, m["dim"])


GatherBackward0 = defop("GatherBackward0", vjps=(_gather_vjp,))

#: Nodes whose gradient is a sparse tensor, a layout of a higher layer: distgrad.sparse
#: installs them here ({"gather": node of gather(..., sparse_grad=True)}).
SPARSE_GRAD_NODES = {}


def gather(input, dim, index, *, sparse_grad=False):
    d = array_of(input)
    dim = wrap_dim(dim, d.ndim)
    node = SPARSE_GRAD_NODES["gather"] if sparse_grad else GatherBackward0
    idx = array_of(index) if isinstance(index, TensorBase) else np.asarray(index)
    if idx.ndim != d.ndim:
        raise RuntimeError("Index tensor must have the same number of dimensions as input tensor")
    out = np.take_along_axis(d[tuple(slice(0, s) if i != dim else slice(None)
                                     for i, s in enumerate(idx.shape))], idx, axis=dim)
    return record(node, out, (input,), (), {"shape": d.shape, "index": idx, "dim": dim},
                  kept=(index,))


def take_along_dim(input, indices, dim=None):
    if dim is None:
        return gather(input.reshape(-1), 0, indices.reshape(-1))
    return gather(input, dim, indices)


WhereBackward0 = defop("WhereBackward0", vjps=(
    lambda xp, g, m: xp.mask(g, m["condition"]),
    lambda xp, g, m: xp.mask(g, ~m["condition"])))


def where(condition, input=None, other=None):
    c = array_of(condition) if isinstance(condition, TensorBase) else np.asarray(condition)
    if input is None and other is None:
        return tuple(wrap(i.astype(np.int64)) for i in np.nonzero(c))
    if c.dtype != np.bool_:
        raise RuntimeError(f"where expected condition to be a boolean tensor, but got a tensor "
                           f"with dtype {c.dtype}")
    if not isinstance(input, TensorBase) and not isinstance(other, TensorBase):
        input = as_tensor_operand(input)
    a, b, ad, bd, dt = operands(input, other)
    out = np.where(c, ad, bd)
    if out.dtype != dt:
        out = out.astype(dt)
    return record(WhereBackward0, out, (a, b), (), {"condition": np.broadcast_to(c, out.shape)},
                  kept=(condition,))


def _tie_vjp(xp, g, m, x, y, which):
    """maximum/minimum: the winner gets the gradient; a tie splits it evenly (PyTorch)."""
    xr = array_of(x) if isinstance(x, TensorBase) else x
    yr = array_of(y) if isinstance(y, TensorBase) else y
    first_wins = (xr > yr) if m["is_max"] else (xr < yr)
    tie = xr == yr
    wins = first_wins if which == 0 else ~(first_wins | tie)
    weight = np.where(tie, 0.5, np.where(wins, 1.0, 0.0)).astype(np.result_type(xr, yr))
    return g * weight


MaximumBackward0 = defop("MaximumBackward0", saved=("self", "other"), pack_reversed=True, vjps=(
    lambda xp, g, m, x, y: _tie_vjp(xp, g, m, x, y, 0),
    lambda xp, g, m, x, y: _tie_vjp(xp, g, m, x, y, 1)))
MinimumBackward0 = defop("MinimumBackward0", saved=("self", "other"), pack_reversed=True,
                         vjps=MaximumBackward0._vjps)


def maximum(input, other):
    a, b, ad, bd, dt = operands(input, as_tensor_operand(other, input))
    return record(MaximumBackward0, np.maximum(ad, bd), (a, b), (a, b), {"is_max": True})


def minimum(input, other):
    a, b, ad, bd, dt = operands(input, as_tensor_operand(other, input))
    return record(MinimumBackward0, np.minimum(ad, bd), (a, b), (a, b), {"is_max": False})


def fmax(input, other):
    return maximum(input, other)


def fmin(input, other):
    return minimum(input, other)


def masked_fill(input, mask, value):
    m = array_of(mask) if isinstance(mask, TensorBase) else np.asarray(mask)
    if m.dtype != np.bool_:
        raise RuntimeError(f"masked_fill_ only supports boolean masks, but got mask with dtype "
                           f"{m.dtype}")
    if isinstance(value, TensorBase):
        if array_of(value).ndim != 0:
            raise RuntimeError(f"masked_fill_ only supports a 0-dimensional value tensor, but got "
                               f"tensor with {array_of(value).ndim} dimension(s).")
        return where(mask if isinstance(mask, TensorBase) else wrap(m), value.to(input.dtype),
                     input)
    out = np.where(m, np.asarray(value, dtype=array_of(input).dtype), array_of(input))
    return record(MaskedFillBackward0, out, (input,), (), {"mask": np.broadcast_to(m, out.shape)},
                  kept=(mask,))


MaskedFillBackward0 = defop("MaskedFillBackward0", vjps=(lambda xp, g, m: xp.mask(g, ~m["mask"]),))


def _triangle(name, keep):
    """``tril``/``triu``: zero the elements outside a triangle of the last two dims."""
    node = defop(name.capitalize() + "Backward0", vjps=(lambda xp, g, m: xp.mask(g, m["keep"]),))

    def op(input, diagonal=0):
        d = array_of(input)
        if d.ndim < 2:
            raise RuntimeError(f"{name}: input tensor must have at least 2 dimensions")
        mask = keep(np.ones(d.shape[-2:], dtype=bool), diagonal)
        return record(node, np.where(mask, d, np.zeros((), d.dtype)), (input,), (),
                      {"keep": mask})
    op.__name__ = op.__qualname__ = name
    op.__doc__ = (f"{name}(input, diagonal=0): ``input`` with the elements "
                  f"{'above' if name == 'tril' else 'below'} the ``diagonal``-th diagonal of "
                  "its last two dimensions set to zero.")
    return op


tril = _triangle("tril", np.tril)
triu = _triangle("triu", np.triu)


def masked_select(input, mask):
    m = array_of(mask) if isinstance(mask, TensorBase) else np.asarray(mask)
    shape = np.broadcast_shapes(array_of(input).shape, m.shape)
    return getitem(input.expand(shape), np.broadcast_to(m, shape), kept=(mask,))


sort_result = namedtuple("sort", ["values", "indices"])
topk_result = namedtuple("topk", ["values", "indices"])


def argsort(input, dim=-1, descending=False, stable=False):
    d = array_of(input)
    dim = wrap_dim(dim, d.ndim)
    if d.ndim == 0:
        return wrap(np.zeros((), dtype=np.int64))
    key = -d if descending and d.dtype.kind != "b" else d
    idx = np.argsort(key, axis=dim, kind="stable")
    if descending and d.dtype.kind == "b":
        idx = np.flip(np.argsort(d, axis=dim, kind="stable"), axis=dim)
    return wrap(idx.astype(np.int64))


def sort(input, dim=-1, descending=False, stable=False):
    """Values (differentiable, through gather) and indices along ``dim``."""
    if array_of(input).ndim == 0:
        return sort_result(input.clone(), wrap(np.zeros((), dtype=np.int64)))
    indices = argsort(input, dim, descending, stable)
    return sort_result(gather(input, dim, indices), indices)


def topk(input, k, dim=-1, largest=True, sorted=True):  # noqa: A002
    d = array_of(input)
    dim = wrap_dim(dim, d.ndim)
    if not 0 <= k <= (d.shape[dim] if d.ndim else 1):
        raise RuntimeError(f"selected index k out of range (k={k}, size {d.shape[dim]})")
    order = argsort(input, dim, descending=largest)
    indices = wrap(np.take(array_of(order), np.arange(k), axis=dim))
    return topk_result(gather(input, dim, indices), indices)

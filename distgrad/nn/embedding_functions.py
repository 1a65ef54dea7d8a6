"""``embedding`` and ``embedding_bag`` of ``distgrad.nn.functional`` (re-exported there):
rows of a weight at integer indices, with ``max_norm``, ``padding_idx``,
``scale_grad_by_freq`` and sparse gradients as in PyTorch."""
import numpy as np

from ..autograd._internal import array_of, defop, record
from .._tensor import Tensor
from ..ops import embedding_bag as _embedding_bag
from ..sparse import gradients as _sparse_gradients


def _embedding_vjp(xp, g, m):
    if m["freq_scale"] is not None:
        g = g * m["freq_scale"]
    grad = xp.index_add(m["shape"], m["key"], g, True)
    if m["padding_idx"] is not None:
        keep = np.ones(m["shape"], dtype=bool)
        keep[m["padding_idx"]] = False
        grad = xp.mask(grad, keep)
    return grad


EmbeddingBackward0 = defop("EmbeddingBackward0", vjps=(_embedding_vjp,))


def _index_array(input, argument, op):
    idx = array_of(input) if isinstance(input, Tensor) else np.asarray(input)
    if idx.dtype.kind not in "iu":
        raise RuntimeError(f"Expected tensor for argument #1 '{argument}' to have one of the "
                           f"following scalar types: Long, Int; but got {idx.dtype} instead"
                           f"{op}")
    return idx


def _renorm_rows_(weight, idx, max_norm, norm_type):
    """Scale the rows of ``weight`` that ``idx`` uses down to norm ``max_norm``, in place
    and outside the graph (PyTorch's ``embedding_renorm_``)."""
    rows = np.unique(idx)
    norms = np.linalg.norm(array_of(weight)[rows], ord=norm_type, axis=1, keepdims=True)
    scale = np.where(norms > max_norm, max_norm / (norms + 1e-7), 1.0)
    array_of(weight)[rows] *= scale.astype(array_of(weight).dtype)


def embedding(input, weight, padding_idx=None, max_norm=None, norm_type=2.0,
              scale_grad_by_freq=False, sparse=False):
    """Rows of ``weight`` at the integer indices ``input``; the padding row gets no gradient."""
    idx = _index_array(input, "indices", "")
    n = array_of(weight).shape[0]
    if idx.size and (idx.min() < -n or idx.max() >= n):
        raise IndexError(f"index {int(idx.max())} is out of range for an embedding of {n} rows")
    if padding_idx is not None and padding_idx < 0:
        padding_idx += n
    if max_norm is not None:
        _renorm_rows_(weight, idx, max_norm, norm_type)
    out = array_of(weight)[idx]
    return record(EmbeddingBackward0 if not sparse else _sparse_gradients.EmbeddingBackward0,
                  out, (weight,), (),
                  {"shape": array_of(weight).shape, "key": (idx,), "padding_idx": padding_idx,
                   "freq_scale": _inverse_frequency(idx, out.dtype)[..., None]
                   if scale_grad_by_freq else None}, kept=(input,))


def _inverse_frequency(idx, dtype):
    """``1 / (how often each entry's value occurs in idx)``: scale_grad_by_freq's factor."""
    _, inverse, counts = np.unique(idx, return_inverse=True, return_counts=True)
    return (1.0 / counts[inverse.reshape(idx.shape)]).astype(dtype)


def embedding_bag(input, weight, offsets=None, max_norm=None, norm_type=2, scale_grad_by_freq=False,
                  mode="mean", sparse=False, per_sample_weights=None, include_last_offset=False,
                  padding_idx=None):
    """Sums, means or maxima of bags of embeddings, without the ``(N, D)`` intermediate.

    ``input`` is ``(B, L)`` (B bags of L indices) or 1-D with ``offsets``, the start of
    each bag (``include_last_offset``: plus the end of the last one). Empty bags give
    zeros; indices equal to ``padding_idx`` are left out (and not counted by mean).

    >>> import distgrad
    >>> w = distgrad.arange(8.).reshape(4, 2)
    >>> embedding_bag(distgrad.tensor([0, 1, 3]), w, distgrad.tensor([0, 2]), mode="sum")
    tensor([[2., 4.],
            [6., 7.]])
    """
    if array_of(weight).dtype.kind in "iu" and array_of(input).dtype.kind == "f":
        import warnings
        warnings.warn("Argument order of nn.functional.embedding_bag was changed. Usage "
                      "`embedding_bag(weight, input, ...)` is deprecated, and should now be "
                      "`embedding_bag(input, weight, ...)`.", stacklevel=2)
        weight, input = input, weight
    if per_sample_weights is not None and tuple(input.shape) != tuple(per_sample_weights.shape):
        raise ValueError(f"embedding_bag: If per_sample_weights ({per_sample_weights.shape}) is "
                         f"not None, then it must have the same shape as the input "
                         f"({input.shape})")
    if weight.dim() != 2:
        raise ValueError(f"weight has to be a 2D Tensor, but got Tensor of dimension "
                         f"{weight.dim()}")
    where = " (while checking arguments for embedding_bag)"
    idx = _index_array(input, "indices", where)
    if idx.ndim == 2:
        if offsets is not None:
            raise ValueError("if input is 2D, then offsets has to be None, as input is treated is "
                             "a mini-batch of fixed length sequences. However, found offsets of "
                             f"type {type(offsets)}")
        starts = np.arange(idx.shape[0]) * idx.shape[1]
        include_last_offset = False
        idx = idx.reshape(-1)
        if per_sample_weights is not None:
            per_sample_weights = per_sample_weights.reshape(-1)
    elif idx.ndim == 1:
        if offsets is None:
            raise ValueError("offsets has to be a 1D Tensor but got None")
        if offsets.dim() != 1:
            raise ValueError("offsets has to be a 1D Tensor")
        starts = _index_array(offsets, "offsets", where)
    else:
        raise ValueError(f"input has to be 1D or 2D Tensor, but got Tensor of dimension "
                         f"{idx.ndim}")
    if mode not in ("sum", "mean", "max"):
        raise ValueError("mode has to be one of sum, mean or max")
    if mode == "max" and scale_grad_by_freq:
        raise ValueError("max mode does not support scaling the gradient by the frequency")
    if mode == "max" and sparse:
        raise ValueError("max mode does not support sparse weights")
    if per_sample_weights is not None and mode != "sum":
        raise NotImplementedError(f"embedding_bag: per_sample_weights was not None. "
                                  f"per_sample_weights is only supported for mode='sum' (got "
                                  f"mode='{mode}'). Please open a feature request on GitHub.")
    if per_sample_weights is not None and per_sample_weights.dtype != weight.dtype:
        raise RuntimeError(f"Expected tensor for argument #1 'weight' to have the same type as "
                           f"tensor for argument #1 'per_sample_weights'; but type "
                           f"{weight.dtype} does not equal {per_sample_weights.dtype}{where}")
    bag_of, num_bags = _bags_from_offsets(starts, idx.size, include_last_offset)
    n = array_of(weight).shape[0]
    bad = np.flatnonzero((idx < 0) | (idx >= n))
    if bad.size:
        raise RuntimeError(f"Index {bad[0]} of input takes value {idx[bad[0]]} which is not in the "
                         f"valid range [0, {n})")
    if padding_idx is not None and padding_idx < 0:
        padding_idx += n
    if max_norm is not None:
        _renorm_rows_(weight, idx, max_norm, norm_type)
    return _embedding_bag.embedding_bag(
        weight, idx, bag_of, num_bags, mode, per_sample_weights, padding_idx,
        _inverse_frequency(idx, array_of(weight).dtype) if scale_grad_by_freq else None,
        node=_embedding_bag.EmbeddingBagBackward0 if not sparse else
        _sparse_gradients.EmbeddingBagBackward0)


def _bags_from_offsets(offsets, length, include_last_offset):
    """The bag of each index (``-1``: after the last bag) and the number of bags."""
    if include_last_offset:
        if offsets.size < 1:
            raise RuntimeError("include_last_offset: number of offset should be at least 1")
        ends = offsets[1:]
        offsets = offsets[:-1]
    else:
        ends = np.append(offsets[1:], length)
    if offsets.size and offsets[0] != 0:
        raise RuntimeError(f"offsets[0] has to be 0, i.e., the first sequence in the mini-batch "
                           f"has to start from position 0. However, got {offsets[0]}")
    if ends.size and ends.max() > length:
        raise RuntimeError(f"offsets[-1] can not be greater than input's length {length} but got "
                           f"offsets[-1] of {ends.max()}")
    if np.any(np.diff(offsets) < 0) or np.any(ends < offsets):
        raise RuntimeError(f"embedding_bag: offsets must be non-decreasing, got "
                           f"{offsets.tolist()}")
    lengths = ends - offsets
    bag_of = np.full(length, -1, dtype=np.int64)
    bag_of[:lengths.sum()] = np.repeat(np.arange(offsets.size), lengths)
    return bag_of, offsets.size

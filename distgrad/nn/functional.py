"""``distgrad.nn.functional``: layers and losses as functions, as ``torch.nn.functional``.

Composite ops (losses, layer_norm, dropout) are written from the primitives in
``distgrad.ops``; ``linear`` is one fused node because it is the hot path of
every MLP.
"""
import numpy as np

from ..autograd.tensor import Tensor
from ..ops import creation, indexing, reduction, shape, softmax as _softmax, unary
from ..ops.linalg import linear
from ..ops.batchnorm import batch_norm
from ..ops.channel_dropout import dropout1d, dropout2d
from ..ops.conv import conv1d, conv2d
from ..ops.conv_transpose import conv_transpose1d, conv_transpose2d
from ..ops.pooling import (adaptive_avg_pool1d, adaptive_avg_pool2d, avg_pool1d, avg_pool2d,
                           max_pool1d, max_pool1d_with_indices, max_pool2d,
                           max_pool2d_with_indices)
from ..ops import embedding_bag as _embedding_bag
from ..ops import layer_norm as _layer_norm
from ..sparse import gradients as _sparse_gradients  # the gradients of sparse=True
from ..ops.attention import scaled_dot_product_attention
from .multi_head_attention import multi_head_attention_forward
# PyTorch's private names, which transformer code written against torch calls as F._...
from .multi_head_attention import canonical_mask as _canonical_mask  # noqa: F401
from .multi_head_attention import none_or_dtype as _none_or_dtype  # noqa: F401
from ..autograd._internal import array_of, wrap, defop, record

__all__ = ["linear", "relu", "relu_", "gelu", "tanh", "sigmoid", "silu", "softplus", "leaky_relu",
           "elu", "dropout", "softmax", "log_softmax", "mse_loss", "l1_loss", "nll_loss",
           "cross_entropy", "binary_cross_entropy", "binary_cross_entropy_with_logits",
           "layer_norm", "embedding", "normalize", "one_hot", "pad"]
__all__ += ["scaled_dot_product_attention", "multi_head_attention_forward", "smooth_l1_loss",
            "huber_loss", "kl_div", "cosine_similarity", "pairwise_distance", "embedding_bag"]
__all__ += ["conv1d", "conv2d", "max_pool1d", "max_pool2d", "max_pool1d_with_indices",
            "max_pool2d_with_indices", "avg_pool1d", "avg_pool2d", "adaptive_avg_pool1d",
            "adaptive_avg_pool2d", "batch_norm", "dropout1d", "dropout2d"]
__all__ += ["conv_transpose1d", "conv_transpose2d"]

tanh = unary.tanh
sigmoid = unary.sigmoid
silu = unary.silu
softplus = unary.softplus
elu = unary.elu


def relu(input, inplace=False):
    return input.relu_() if inplace else unary.relu(input)


def relu_(input):
    return input.relu_()


def gelu(input, approximate="none"):
    return unary.gelu(input, approximate=approximate)


def leaky_relu(input, negative_slope=0.01, inplace=False):
    return unary.leaky_relu(input, negative_slope)


def softmax(input, dim=None, _stacklevel=3, dtype=None):
    return _softmax.softmax(input, dim, dtype)


def log_softmax(input, dim=None, _stacklevel=3, dtype=None):
    return _softmax.log_softmax(input, dim, dtype)


def dropout(input, p=0.5, training=True, inplace=False):
    """Zero elements with probability ``p`` and scale the rest by ``1 / (1 - p)``."""
    if p < 0.0 or p > 1.0:
        raise ValueError(f"dropout probability has to be between 0 and 1, but got {p}")
    if not training or p == 0.0:
        return input
    if p == 1.0:
        mask = np.zeros(array_of(input).shape, dtype=array_of(input).dtype)
    else:
        keep = creation._rng(None).random(array_of(input).shape) >= p
        mask = keep.astype(array_of(input).dtype) / (1.0 - p)
    if inplace:
        return input.mul_(wrap(mask))
    return input * wrap(mask)


def _reduce(loss, reduction):
    if reduction == "mean":
        return loss.mean()
    if reduction == "sum":
        return loss.sum()
    if reduction == "none":
        return loss
    raise ValueError(f"{reduction} is not a valid value for reduction")


def _check_same_shape(input, target):
    if input.shape != target.shape:
        import warnings
        warnings.warn(f"Using a target size ({target.shape}) that is different to the input size "
                      f"({input.shape}). This will likely lead to incorrect results due to "
                      "broadcasting. Please ensure they have the same size.", UserWarning,
                      stacklevel=3)


def mse_loss(input, target, size_average=None, reduce=None, reduction="mean", weight=None):
    _check_same_shape(input, target)
    diff = input - target
    return _reduce_weighted(diff * diff, _legacy_reduction(size_average, reduce, reduction),
                            weight, input)


def l1_loss(input, target, size_average=None, reduce=None, reduction="mean", weight=None):
    _check_same_shape(input, target)
    return _reduce_weighted(unary.abs(input - target),
                            _legacy_reduction(size_average, reduce, reduction), weight, input)


def _reduce_weighted(loss, reduction, weight, input):
    """PyTorch's elementwise-weighted losses: 'mean' is sum(weight * loss) / sum(weight)."""
    if weight is None:
        return _reduce(loss, reduction)
    if weight.shape != input.shape:
        raise ValueError("Weights and input must have the same size.")
    loss = loss * weight
    if reduction == "mean":
        return loss.sum() / weight.sum()
    if reduction not in ("sum", "none"):
        raise ValueError(f"Invalid reduction mode: {reduction}. Expected one of 'none', 'mean', "
                         "'sum'.")
    return _reduce(loss, reduction)


def _legacy_reduction(size_average, reduce, reduction):
    if size_average is None and reduce is None:
        return reduction
    size_average = True if size_average is None else size_average
    reduce = True if reduce is None else reduce
    if not reduce:
        return "none"
    return "mean" if size_average else "sum"


def nll_loss(input, target, weight=None, size_average=None, ignore_index=-100, reduce=None,
             reduction="mean"):
    """Negative log likelihood of log-probabilities ``input`` (N, C, ...) at class ``target``."""
    reduction = _legacy_reduction(size_average, reduce, reduction)
    t = array_of(target) if isinstance(target, Tensor) else np.asarray(target)
    if t.dtype.kind not in "iu":
        raise RuntimeError(f"expected scalar type Long but found {target.dtype!r}")
    x = input
    if x.ndim == 1:  # (C,) with a scalar target
        x = x.unsqueeze(0)
        t = t.reshape(1)
    if x.ndim > 2:  # (N, C, d1, ...) -> (N*d1*..., C)
        c = x.shape[1]
        x = shape.movedim(x, 1, -1).reshape(-1, c)
        t = t.reshape(-1)
    n, c = array_of(x).shape
    if t.shape != (n,):
        raise ValueError(f"Expected input batch_size ({n}) to match target batch_size "
                         f"({t.shape[0] if t.ndim else 1}).")
    valid = t != ignore_index
    if np.any((t[valid] < 0) | (t[valid] >= c)):
        bad = int(t[valid][(t[valid] < 0) | (t[valid] >= c)][0])
        raise IndexError(f"Target {bad} is out of bounds for {c} classes.")
    safe_t = np.where(valid, t, 0)
    picked = x[np.arange(n), safe_t]
    w = np.ones(n, dtype=array_of(x).dtype) if weight is None else \
        array_of(weight)[safe_t].astype(array_of(x).dtype)
    w = np.where(valid, w, 0).astype(array_of(x).dtype)
    losses = -picked * wrap(w)
    if reduction == "none":
        return losses.reshape(np.shape(array_of(target) if isinstance(target, Tensor) else target))
    if reduction == "sum":
        return losses.sum()
    return losses.sum() / wrap(np.asarray(w.sum(), dtype=array_of(x).dtype))


def cross_entropy(input, target, weight=None, size_average=None, ignore_index=-100, reduce=None,
                  reduction="mean", label_smoothing=0.0):
    """log_softmax over dim 1 followed by nll_loss (or soft-label cross entropy for float targets)."""
    reduction = _legacy_reduction(size_average, reduce, reduction)
    if not 0.0 <= label_smoothing <= 1.0:
        raise RuntimeError(f"label_smoothing must be between 0.0 and 1.0. Got: {label_smoothing}")
    class_dim = 0 if input.ndim == 1 else 1
    logp = _softmax.log_softmax(input, class_dim)
    is_probs = isinstance(target, Tensor) and array_of(target).dtype.kind == "f"
    c = input.shape[class_dim]
    if is_probs:
        if label_smoothing > 0:
            target = target * (1 - label_smoothing) + label_smoothing / c
        wlogp = logp if weight is None else logp * weight.reshape(
            [c] + [1] * (input.ndim - class_dim - 1))
        loss = -(wlogp * target).sum(class_dim)
        if reduction == "mean":
            return loss.sum() / (input.shape[0] if input.ndim > 1 else 1)
        return _reduce(loss, reduction)
    nll = nll_loss(logp, target, weight, ignore_index=ignore_index, reduction=reduction)
    if label_smoothing <= 0:
        return nll
    # PyTorch's label smoothing: (1 - eps) * nll + eps * mean over classes of -logp (weighted).
    t = array_of(target) if isinstance(target, Tensor) else np.asarray(target)
    valid = wrap((t != ignore_index).astype(array_of(input).dtype))
    wlogp = logp if weight is None else logp * weight.reshape([c] + [1] * (input.ndim - class_dim - 1))
    smooth = -wlogp.sum(class_dim) * valid
    if reduction == "none":
        smooth_red = smooth
    elif reduction == "sum":
        smooth_red = smooth.sum()
    elif weight is None:
        smooth_red = smooth.sum() / valid.sum()
    else:
        w_t = wrap(array_of(weight)[np.where(t != ignore_index, t, 0)]) * valid
        smooth_red = smooth.sum() / w_t.sum()
    return nll * (1 - label_smoothing) + smooth_red * (label_smoothing / c)


def binary_cross_entropy(input, target, weight=None, size_average=None, reduce=None,
                         reduction="mean"):
    """``-(t log p + (1 - t) log(1 - p))``, each log clamped at -100 as PyTorch does."""
    reduction = _legacy_reduction(size_average, reduce, reduction)
    if target.shape != input.shape:
        raise ValueError(f"Using a target size ({target.shape}) that is different to the input "
                         f"size ({input.shape}) is deprecated. Please ensure they have the same "
                         "size.")
    p = array_of(input)
    if p.size and not ((p >= 0) & (p <= 1)).all():
        raise RuntimeError("all elements of input should be between 0 and 1")
    log_p = unary.clamp(unary.log(input), min=-100)
    log_1mp = unary.clamp(unary.log(1 - input), min=-100)
    loss = -(target * log_p + (1 - target) * log_1mp)
    if weight is not None:
        loss = loss * weight
    return _reduce(loss, reduction)


def binary_cross_entropy_with_logits(input, target, weight=None, size_average=None, reduce=None,
                                     reduction="mean", pos_weight=None):
    """BCE of ``sigmoid(input)``, computed stably from the logits; ``pos_weight`` weighs the
    positive term (broadcast along the last, class, dimension)."""
    reduction = _legacy_reduction(size_average, reduce, reduction)
    if target.shape != input.shape:
        raise ValueError(f"Target size ({target.shape}) must be the same as input size "
                         f"({input.shape})")
    log_sig = -unary.softplus(-input)
    log_1msig = -unary.softplus(input)
    pos = target * log_sig if pos_weight is None else pos_weight * target * log_sig
    loss = -(pos + (1 - target) * log_1msig)
    if weight is not None:
        loss = loss * weight
    return _reduce(loss, reduction)


def _huber(diff, delta):
    """Quadratic below ``delta``, linear above: ``0.5 d^2`` or ``delta (|d| - delta / 2)``."""
    magnitude = unary.abs(diff)
    quadratic = diff * diff * 0.5
    linear = (magnitude - 0.5 * delta) * delta
    return indexing.where(wrap(array_of(magnitude) < delta), quadratic, linear)


def smooth_l1_loss(input, target, size_average=None, reduce=None, reduction="mean", beta=1.0):
    """Huber loss divided by ``beta``: ``0.5 d^2 / beta`` below ``beta``, else ``|d| - beta / 2``.

    >>> import distgrad
    >>> smooth_l1_loss(distgrad.tensor([0.5, 3.0]), distgrad.zeros(2), reduction="none").tolist()
    [0.125, 2.5]
    """
    _check_same_shape(input, target)
    reduction = _legacy_reduction(size_average, reduce, reduction)
    if beta < 0:
        raise RuntimeError("smooth_l1_loss does not support negative values for beta.")
    diff = input - target
    if beta == 0.0:
        return _reduce(unary.abs(diff), reduction)
    return _reduce(_huber(diff, beta) / beta, reduction)


def huber_loss(input, target, reduction="mean", delta=1.0, weight=None):
    """``0.5 d^2`` below ``delta``, else ``delta (|d| - delta / 2)``; ``weight`` is
    elementwise and 'mean' averages the weighted losses."""
    _check_same_shape(input, target)
    if delta <= 0:
        raise RuntimeError("huber_loss does not support non-positive values for delta.")
    loss = _huber(input - target, delta)
    if weight is not None:
        if weight.shape != input.shape:
            raise ValueError("Weights and input must have the same size.")
        loss = loss * weight
    return _reduce(loss, reduction)


def kl_div(input, target, size_average=None, reduce=None, reduction="mean", log_target=False):
    """KL divergence of ``target`` from log-probabilities ``input``:
    ``target * (log target - input)`` (``0`` where target is 0). ``'batchmean'`` divides the
    sum by the batch size, the mathematical KL; ``'mean'`` divides by every element."""
    if size_average is not None or reduce is not None:
        reduction = _legacy_reduction(size_average, reduce, reduction)
    elif reduction == "mean":
        import warnings
        warnings.warn("reduction: 'mean' divides the total loss by both the batch size and the "
                      "support size.'batchmean' divides only by the batch size, and aligns with "
                      "the KL div math definition.'mean' will be changed to behave the same as "
                      "'batchmean' in the next major release.", UserWarning, stacklevel=2)
    if log_target:
        loss = unary.exp(target) * (target - input)
    else:
        zero = wrap(array_of(target) == 0)
        safe = indexing.where(zero, 1.0, target)  # log(0) would put NaN into the gradient
        loss = indexing.where(zero, 0.0, target * unary.log(safe)) - target * input
    if reduction == "batchmean":
        return loss.sum() / input.shape[0] if input.ndim else loss.sum()
    return _reduce(loss, reduction)


def cosine_similarity(x1, x2, dim=1, eps=1e-8):
    """``x1 . x2 / (max(|x1|, eps) max(|x2|, eps))`` along ``dim`` (inputs broadcast).

    As in PyTorch the norms are clamped as values only: the gradient is that of the
    unclamped norms.
    """
    def unit(x):
        n = reduction.norm(x, 2, dim, keepdim=True)
        return x / (n + wrap(np.maximum(array_of(n), eps) - array_of(n)))
    return (unit(x1) * unit(x2)).sum(dim)


def pairwise_distance(x1, x2, p=2.0, eps=1e-6, keepdim=False):
    """``||x1 - x2 + eps||_p`` over the last dimension."""
    diff = x1 - x2 + eps
    return reduction.norm(diff, p, -1 if diff.ndim else None, keepdim=keepdim)


def layer_norm(input, normalized_shape, weight=None, bias=None, eps=1e-5):
    """Normalise over the trailing ``normalized_shape`` dimensions (biased variance)."""
    if isinstance(normalized_shape, int):
        normalized_shape = (normalized_shape,)
    normalized_shape = tuple(normalized_shape)
    k = len(normalized_shape)
    if tuple(input.shape[input.ndim - k:]) != normalized_shape:
        raise RuntimeError(f"Given normalized_shape={list(normalized_shape)}, expected input with "
                           f"shape [*, {', '.join(str(s) for s in normalized_shape)}], but got "
                           f"input of size{list(input.shape)}")
    for name, param in (("weight", weight), ("bias", bias)):
        if param is not None and tuple(param.shape) != normalized_shape:
            raise RuntimeError(f"Expected {name} to be of same shape as normalized_shape, but got "
                               f"{name} of shape {list(param.shape)} and normalized_shape = "
                               f"{list(normalized_shape)}")
    if _fusable_layer_norm(input, weight, bias):
        return _layer_norm.layer_norm(input, normalized_shape, weight, bias, eps)
    dims = tuple(range(input.ndim - k, input.ndim))
    mu = input.mean(dims, keepdim=True)
    centered = input - mu
    var = (centered * centered).mean(dims, keepdim=True)
    out = centered * unary.rsqrt(var + eps)
    if weight is not None:
        out = out * weight
    if bias is not None:
        out = out + bias
    return out


def _fusable_layer_norm(input, weight, bias):
    """The fused op covers floating inputs with parameters of their dtype; anything else
    (integers, mixed dtypes) keeps the composite's promotion rules."""
    dtype = array_of(input).dtype
    return dtype.kind == "f" and all(p is None or array_of(p).dtype == dtype
                                     for p in (weight, bias))


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


def normalize(input, p=2.0, dim=1, eps=1e-12, out=None):
    denom = unary.clamp_min(reduction.norm(input, p, dim, keepdim=True), eps)
    return input / denom


def one_hot(tensor, num_classes=-1):
    """``(*) -> (*, num_classes)`` int64 with a 1 at each index."""
    t = array_of(tensor)
    if t.dtype != np.int64:
        raise RuntimeError("one_hot is only applicable to index tensor of type LongTensor.")
    if num_classes == -1:
        if t.size == 0:
            raise RuntimeError("Can not infer total number of classes from empty tensor.")
        num_classes = int(t.max()) + 1
    if t.size and t.min() < 0:
        raise RuntimeError("Class values must be non-negative.")
    if t.size and t.max() >= num_classes:
        raise RuntimeError("Class values must be smaller than num_classes.")
    return wrap(np.eye(num_classes, dtype=np.int64)[t])


def _circular_positions(before, after, n):
    # PyTorch crops first (negative amounts), then wraps around what is left.
    start, stop = max(0, -before), n - max(0, -after)
    return start + np.mod(np.arange(-max(0, before), stop - start + max(0, after)), stop - start)


_PAD_POSITIONS = {  # (before, after, n) -> the input position each output position copies
    "reflect": lambda b, a, n: (n - 1) - np.abs((n - 1) - np.abs(np.arange(-b, n + a))),
    "replicate": lambda b, a, n: np.clip(np.arange(-b, n + a), 0, n - 1),
    "circular": _circular_positions,
}


def pad(input, pad, mode="constant", value=None):
    """Pad the last ``len(pad) // 2`` dimensions: ``pad = (last_before, last_after,
    second_last_before, ...)``; negative amounts crop. Modes: constant (``value``),
    reflect, replicate, circular (the last 1-3 dimensions of a batched input)."""
    pad = [int(p) for p in pad]
    d = array_of(input)
    if len(pad) % 2:
        raise RuntimeError("Padding length must be divisible by 2")
    if len(pad) // 2 > d.ndim:
        raise RuntimeError(f"Padding length should be less than or equal to two times the input "
                           f"dimension but got padding length {len(pad)} and input of dimension "
                           f"{d.ndim}")
    dims = [d.ndim - 1 - i for i in range(len(pad) // 2)]
    amounts = {dim: (pad[2 * i], pad[2 * i + 1]) for i, dim in enumerate(dims)}
    if mode == "constant":
        return _pad_constant(input, amounts, 0.0 if value is None else value)
    if mode not in _PAD_POSITIONS:
        raise NotImplementedError(f"Unrecognised padding mode {mode}")
    if value is not None and value != 0:
        raise RuntimeError(f'Padding mode "{mode}" doesn\'t take in value argument')
    k = len(pad) // 2
    if k not in (1, 2, 3) or d.ndim not in (k + 1, k + 2):
        raise NotImplementedError(
            f"Padding size {len(pad)} is not supported for {d.ndim}D input tensor.\n"
            "Supported combinations for non-constant padding:\n"
            "  - 2D or 3D input: padding size = 2 (pads last dimension)\n"
            "  - 3D or 4D input: padding size = 4 (pads last 2 dimensions)\n"
            "  - 4D or 5D input: padding size = 6 (pads last 3 dimensions)")
    key = []
    for dim in range(d.ndim - k, d.ndim):
        before, after = amounts[dim]
        n = d.shape[dim]
        if mode == "reflect" and (before >= n or after >= n):
            raise RuntimeError(f"Argument #4: Padding size should be less than the corresponding "
                               f"input dimension, but got: padding ({before}, {after}) at "
                               f"dimension {dim} of input {list(d.shape)}")
        if mode == "circular" and (before > n or after > n):
            raise RuntimeError("Padding value causes wrapping around more than once.")
        key.append(_PAD_POSITIONS[mode](before, after, n))
    # One gather: repeated source positions (edges, reflections) accumulate in backward.
    return indexing.getitem(input, (Ellipsis,) + np.ix_(*key))


def _pad_constant(input, amounts, value):
    d = array_of(input)
    crop = tuple(slice(max(0, -amounts[i][0]), d.shape[i] - max(0, -amounts[i][1]))
                 if i in amounts else slice(None) for i in range(d.ndim))
    kept = input[crop] if any(min(a) < 0 for a in amounts.values()) else input
    widths = [(max(0, amounts[i][0]), max(0, amounts[i][1])) if i in amounts else (0, 0)
              for i in range(d.ndim)]
    shape_out = tuple(s + a + b for s, (a, b) in zip(array_of(kept).shape, widths))
    if any(s < 0 for s in shape_out) or any(c.stop is not None and c.stop < c.start for c in crop):
        raise RuntimeError("narrow(): length must be non-negative.")
    out = creation.full(shape_out, value, dtype=input.dtype)
    key = tuple(slice(a, a + s) for s, (a, _) in zip(array_of(kept).shape, widths))
    return indexing.index_put(out, key, kept)

"""``distgrad.nn.functional``: layers and losses as functions, as ``torch.nn.functional``.

Composite ops (losses, layer_norm, dropout) are written from the primitives in
``distgrad.ops``; ``linear`` is one fused node because it is the hot path of
every MLP.
"""
import sys

import numpy as np

from ..ops import creation, indexing, reduction, softmax as _softmax, unary
from ..ops.op_names import observe as _observe
from ..ops.linalg import linear
from ..ops.batchnorm import batch_norm
from ..ops.channel_dropout import dropout1d, dropout2d
from ..ops.conv import conv1d, conv2d
from ..ops.conv_transpose import conv_transpose1d, conv_transpose2d
from ..ops.pooling import (adaptive_avg_pool1d, adaptive_avg_pool2d, avg_pool1d, avg_pool2d,
                           max_pool1d, max_pool1d_with_indices, max_pool2d,
                           max_pool2d_with_indices)
from ..ops import layer_norm as _layer_norm
from ..ops.attention import scaled_dot_product_attention
from .multi_head_attention import multi_head_attention_forward
# PyTorch's private names, which transformer code written against torch calls as F._...
from .multi_head_attention import canonical_mask as _canonical_mask  # noqa: F401
from .multi_head_attention import none_or_dtype as _none_or_dtype  # noqa: F401
from ..autograd._internal import array_of, wrap
from .embedding_functions import embedding, embedding_bag
from .loss_functions import (binary_cross_entropy, binary_cross_entropy_with_logits,
                             cross_entropy, huber_loss, kl_div, l1_loss, mse_loss, nll_loss,
                             smooth_l1_loss)
from .loss_functions import _legacy_reduction  # noqa: F401  (nn.modules.loss uses F._...)

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


# The functions that are ops of their own in PyTorch (one event each in the profiler); the
# others here hand over to an op of distgrad.ops, which records it.
_observe(sys.modules[__name__], {
    "mse_loss": "aten::mse_loss", "l1_loss": "aten::l1_loss", "nll_loss": "aten::nll_loss_nd",
    "cross_entropy": "aten::cross_entropy_loss",
    "binary_cross_entropy": "aten::binary_cross_entropy",
    "binary_cross_entropy_with_logits": "aten::binary_cross_entropy_with_logits",
    "smooth_l1_loss": "aten::smooth_l1_loss", "huber_loss": "aten::huber_loss",
    "kl_div": "aten::kl_div", "dropout": "aten::dropout", "layer_norm": "aten::layer_norm",
    "embedding": "aten::embedding", "one_hot": "aten::one_hot", "pad": "aten::pad",
    "cosine_similarity": "aten::cosine_similarity",
    "pairwise_distance": "aten::pairwise_distance"})

"""``distgrad.nn.functional``: layers and losses as functions, as ``torch.nn.functional``.

Composite ops (losses, layer_norm, dropout) are written from the primitives in
``distgrad.ops``; ``linear`` is one fused node because it is the hot path of
every MLP.
"""
import numpy as np

from ..autograd.tensor import Tensor, _make
from ..ops import creation, indexing, reduction, shape, softmax as _softmax, unary
from ..ops.linalg import linear
from ..ops.registry import defop, record
from ..ops.attention import scaled_dot_product_attention
from .multi_head_attention import canonical_mask as _canonical_mask, multi_head_attention_forward
from .multi_head_attention import none_or_dtype as _none_or_dtype

__all__ = ["linear", "relu", "relu_", "gelu", "tanh", "sigmoid", "silu", "softplus", "leaky_relu",
           "elu", "dropout", "softmax", "log_softmax", "mse_loss", "l1_loss", "nll_loss",
           "cross_entropy", "binary_cross_entropy", "binary_cross_entropy_with_logits",
           "layer_norm", "embedding", "normalize", "one_hot", "pad"]
__all__ += ["scaled_dot_product_attention", "multi_head_attention_forward"]

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
        mask = np.zeros(input._data.shape, dtype=input._data.dtype)
    else:
        keep = creation._rng(None).random(input._data.shape) >= p
        mask = keep.astype(input._data.dtype) / (1.0 - p)
    if inplace:
        return input.mul_(_make(mask))
    return input * _make(mask)


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
    return _reduce(diff * diff, _legacy_reduction(size_average, reduce, reduction))


def l1_loss(input, target, size_average=None, reduce=None, reduction="mean"):
    _check_same_shape(input, target)
    return _reduce(unary.abs(input - target), _legacy_reduction(size_average, reduce, reduction))


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
    t = target._data if isinstance(target, Tensor) else np.asarray(target)
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
    n, c = x._data.shape
    if t.shape != (n,):
        raise ValueError(f"Expected input batch_size ({n}) to match target batch_size "
                         f"({t.shape[0] if t.ndim else 1}).")
    valid = t != ignore_index
    if np.any((t[valid] < 0) | (t[valid] >= c)):
        bad = int(t[valid][(t[valid] < 0) | (t[valid] >= c)][0])
        raise IndexError(f"Target {bad} is out of bounds for {c} classes.")
    safe_t = np.where(valid, t, 0)
    picked = x[np.arange(n), safe_t]
    w = np.ones(n, dtype=x._data.dtype) if weight is None else \
        weight._data[safe_t].astype(x._data.dtype)
    w = np.where(valid, w, 0).astype(x._data.dtype)
    losses = -picked * _make(w)
    if reduction == "none":
        return losses.reshape(target.shape) if isinstance(target, Tensor) and target.ndim else losses
    if reduction == "sum":
        return losses.sum()
    return losses.sum() / _make(np.asarray(w.sum(), dtype=x._data.dtype))


def cross_entropy(input, target, weight=None, size_average=None, ignore_index=-100, reduce=None,
                  reduction="mean", label_smoothing=0.0):
    """log_softmax over dim 1 followed by nll_loss (or soft-label cross entropy for float targets)."""
    reduction = _legacy_reduction(size_average, reduce, reduction)
    class_dim = 0 if input.ndim == 1 else 1
    logp = _softmax.log_softmax(input, class_dim)
    is_probs = isinstance(target, Tensor) and target._data.dtype.kind == "f"
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
    t = target._data if isinstance(target, Tensor) else np.asarray(target)
    valid = _make((t != ignore_index).astype(input._data.dtype))
    wlogp = logp if weight is None else logp * weight.reshape([c] + [1] * (input.ndim - class_dim - 1))
    smooth = -wlogp.sum(class_dim) * valid
    if reduction == "none":
        smooth_red = smooth
    elif reduction == "sum":
        smooth_red = smooth.sum()
    elif weight is None:
        smooth_red = smooth.sum() / valid.sum()
    else:
        w_t = _make(weight._data[np.where(t != ignore_index, t, 0)]) * valid
        smooth_red = smooth.sum() / w_t.sum()
    return nll * (1 - label_smoothing) + smooth_red * (label_smoothing / c)


def binary_cross_entropy(input, target, weight=None, size_average=None, reduce=None,
                         reduction="mean"):
    reduction = _legacy_reduction(size_average, reduce, reduction)
    log_p = unary.clamp(unary.log(input), min=-100)
    log_1mp = unary.clamp(unary.log(1 - input), min=-100)
    loss = -(target * log_p + (1 - target) * log_1mp)
    if weight is not None:
        loss = loss * weight
    return _reduce(loss, reduction)


def binary_cross_entropy_with_logits(input, target, weight=None, size_average=None, reduce=None,
                                     reduction="mean", pos_weight=None):
    reduction = _legacy_reduction(size_average, reduce, reduction)
    log_sig = -unary.softplus(-input)
    log_1msig = -unary.softplus(input)
    pos = target * log_sig if pos_weight is None else pos_weight * target * log_sig
    loss = -(pos + (1 - target) * log_1msig)
    if weight is not None:
        loss = loss * weight
    return _reduce(loss, reduction)


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


def _embedding_vjp(xp, g, m):
    grad = xp.index_add(m["shape"], m["key"], g, True)
    if m["padding_idx"] is not None:
        keep = np.ones(m["shape"], dtype=bool)
        keep[m["padding_idx"]] = False
        grad = xp.mask(grad, keep)
    return grad


EmbeddingBackward0 = defop("EmbeddingBackward0", vjps=(_embedding_vjp,))


def embedding(input, weight, padding_idx=None, max_norm=None, norm_type=2.0,
              scale_grad_by_freq=False, sparse=False):
    """Rows of ``weight`` at the integer indices ``input``; the padding row gets no gradient."""
    idx = input._data if isinstance(input, Tensor) else np.asarray(input)
    if idx.dtype.kind not in "iu":
        raise RuntimeError(f"Expected tensor for argument #1 'indices' to have one of the "
                           f"following scalar types: Long, Int; but got {idx.dtype} instead")
    n = weight._data.shape[0]
    if idx.size and (idx.min() < -n or idx.max() >= n):
        raise IndexError(f"index {int(idx.max())} is out of range for an embedding of {n} rows")
    if padding_idx is not None and padding_idx < 0:
        padding_idx += n
    if max_norm is not None:
        from ..autograd.grad_mode import no_grad
        with no_grad():
            rows = np.unique(idx)
            norms = np.linalg.norm(weight._data[rows], ord=norm_type, axis=1, keepdims=True)
            scale = np.where(norms > max_norm, max_norm / (norms + 1e-7), 1.0)
            weight._data[rows] *= scale.astype(weight._data.dtype)
    out = weight._data[idx]
    return record(EmbeddingBackward0, out, (weight,), (),
                  {"shape": weight._data.shape, "key": (idx,), "padding_idx": padding_idx})


def normalize(input, p=2.0, dim=1, eps=1e-12, out=None):
    denom = unary.clamp_min(reduction.norm(input, p, dim, keepdim=True), eps)
    return input / denom


def one_hot(tensor, num_classes=-1):
    t = tensor._data
    n = int(t.max()) + 1 if num_classes == -1 else num_classes
    return _make(np.eye(n, dtype=np.int64)[t])


def pad(input, pad, mode="constant", value=0.0):
    if mode != "constant":
        raise NotImplementedError(f"pad mode {mode!r} is not supported by distgrad")
    if len(pad) % 2:
        raise RuntimeError("Padding length must be divisible by 2")
    d = input._data
    widths = [(0, 0)] * d.ndim
    for i in range(len(pad) // 2):
        widths[d.ndim - 1 - i] = (pad[2 * i], pad[2 * i + 1])
    out = creation.full(tuple(s + a + b for s, (a, b) in zip(d.shape, widths)), value,
                        dtype=input.dtype)
    key = tuple(slice(a, a + s) for s, (a, b) in zip(d.shape, widths))
    return indexing.index_put(out, key, input)

"""Losses of ``distgrad.nn.functional`` (re-exported there), as ``torch.nn.functional``'s:
written from differentiable primitives, with PyTorch's reduction arguments (the legacy
``size_average``/``reduce`` pair included)."""
import numpy as np

from ..autograd._internal import array_of, defop, record, wrap
from .._tensor import Tensor
from ..ops import indexing, reduction, shape, softmax as _softmax, unary


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
    if reduction not in ("none", "sum", "mean"):
        raise ValueError(f"{reduction} is not a valid value for reduction")
    out = _nll(x, np.where(valid, t, 0), valid, weight, reduction)
    target_shape = np.shape(array_of(target) if isinstance(target, Tensor) else target)
    if reduction == "none" and out.shape != target_shape:
        return out.reshape(target_shape)
    return out


def _nll_vjp(xp, g, m):
    return xp.index_add(m["shape"], m["key"], g * m["coef"], True)


# One node, as PyTorch's: on a small classifier the loss written from primitives (index,
# negate, weigh, sum, divide: five nodes) cost more than the model's layers.
NllLossBackward0 = defop("NllLossBackward0", vjps=(_nll_vjp,))


def _nll(x, t, valid, weight, reduction):
    """``-w[t] * x[i, t]`` of log-probabilities ``x`` (N, C) and classes ``t`` (N,), reduced;
    a sample that is not ``valid`` (its class is the ignored one) weighs 0."""
    d = array_of(x)
    n = d.shape[0]
    w = np.ones(n, dtype=d.dtype) if weight is None else array_of(weight)[t].astype(d.dtype)
    w = np.where(valid, w, 0).astype(d.dtype)
    key = (np.arange(n), t)
    losses = -d[key] * w
    if reduction == "none":
        out, coef = losses, -w
    elif reduction == "sum":
        out, coef = losses.sum(), -w
    else:
        total = np.asarray(w.sum(), dtype=d.dtype)
        out, coef = losses.sum() / total, -w / total
    return record(NllLossBackward0, np.asarray(out, dtype=d.dtype), (x,), (),
                  {"shape": d.shape, "key": key, "coef": coef})


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

"""Scaled dot-product attention as one fused node: scores, masked softmax, dropout, weighted sum.

Written from primitives, ``softmax(q @ k^T * scale + bias) @ v`` is five nodes and
as many full-size intermediates per call. Fused, the forward keeps only the
probabilities ``P`` and the backward is four batched matmuls and one row sum::

    dPd = g @ v^T (+ g_weights)      dv = Pd^T @ g          (Pd = P * drop)
    dP  = dPd * drop                 dS = P * (dP - rowsum(dP * P))
    dq  = scale * dS @ k             dk = scale * dS^T @ q      dbias = dS

Batch dimensions broadcast as in ``torch.matmul``; the engine sums gradients back
to each input's shape. Under ``create_graph=True`` the rule recomputes ``P`` from
differentiable ops, so higher-order gradients see how ``P`` depends on q and k.

>>> import distgrad
>>> from distgrad.ops.attention import scaled_dot_product_attention
>>> q = distgrad.randn(2, 4, 5, 8)        # (batch, heads, target length, head dim)
>>> scaled_dot_product_attention(q, q, q, is_causal=True).shape
distgrad.Size([2, 4, 5, 8])
"""
import math

import numpy as np

from ..autograd import dtype as _dt
from . import conversion, creation, indexing, linalg, shape, softmax as _softmax
from ..autograd._internal import array_of, wrap, defop, record, record_multi

__all__ = ["attention", "scaled_dot_product_attention", "causal_bias"]


def _softmax_rows(scores, zero_masked_rows):
    """Softmax over the last axis, in place. A row that is all ``-inf`` gives NaN, as
    ``torch.softmax`` does, or zeros with ``zero_masked_rows`` (SDPA's safe softmax)."""
    row_max = scores.max(axis=-1, keepdims=True)
    if zero_masked_rows:
        row_max[np.isneginf(row_max)] = 0  # exp(-inf - 0) = 0 instead of exp(nan)
    with np.errstate(invalid="ignore"):  # -inf - -inf: the NaN row PyTorch gives too
        np.subtract(scores, row_max, out=scores)
    np.exp(scores, out=scores)
    denom = scores.sum(axis=-1, keepdims=True)
    if zero_masked_rows:
        denom[denom == 0] = 1
    scores /= denom
    return scores


def _differentiable_probs(q, k, bias, m):
    """P from tensor ops, for ``create_graph=True``: the saved P is a constant there."""
    scores = linalg.matmul(q, shape.transpose(k, -1, -2)) * m["scale"]
    if bias is not None:
        scores = scores + bias
    if not m["zero_masked_rows"]:
        return _softmax.softmax(scores, -1)
    # Rows with nothing to attend to are zeroed before the softmax too: the NaN of an
    # all -inf row would otherwise leak into the gradient through the masked branch.
    live = wrap(np.broadcast_to(~np.all(np.isneginf(array_of(scores)), axis=-1, keepdims=True),
                                 array_of(scores).shape))
    probs = _softmax.softmax(indexing.where(live, scores, 0.0), -1)
    return indexing.where(live, probs, 0.0)


def _attention_vjp_all(xp, grads, m, needs, q, k, v, probs, bias=None):
    need_q, need_k, need_v, need_bias = needs
    g = grads[0]
    g_weights = grads[1] if len(grads) > 1 else None
    drop = m["drop"]
    if xp.is_tensor_backend():
        probs = _differentiable_probs(q, k, bias, m)
    dropped = probs if drop is None else probs * drop
    dv = None
    if need_v and g is not None:
        dv = xp.matmul(xp.swapaxes(dropped, -1, -2), g)
    if not (need_q or need_k or need_bias):
        return None, None, dv, None
    if g is None:
        d_dropped = g_weights
    else:
        d_dropped = xp.matmul(g, xp.swapaxes(v, -1, -2))
        if g_weights is not None:
            d_dropped = d_dropped + g_weights
    d_probs = d_dropped if drop is None else d_dropped * drop
    d_scores = probs * (d_probs - xp.sum(d_probs * probs, axis=-1, keepdims=True))
    scaled = d_scores * m["scale"]
    dq = xp.matmul(scaled, k) if need_q else None
    dk = xp.matmul(xp.swapaxes(scaled, -1, -2), q) if need_k else None
    return dq, dk, dv, (d_scores if need_bias else None)


# Named after the node PyTorch records for SDPA on CPU; the math is the plain one above.
ScaledDotProductAttentionBackward = defop(
    "ScaledDotProductFlashAttentionForCpuBackward0",
    saved=("query", "key", "value", "attn_weights", "attn_mask"), vjp_all=_attention_vjp_all)


def dropout_keep_mask(shape_, dtype, p):
    """The multiplier of inverted dropout: 0 with probability ``p``, else ``1 / (1 - p)``."""
    if p >= 1.0:
        return np.zeros(shape_, dtype=dtype)
    keep = creation._rng(None).random(shape_) >= p
    return keep.astype(dtype) / dtype.type(1.0 - p)


def attention(query, key, value, bias=None, scale=1.0, dropout_p=0.0, need_weights=False,
              zero_masked_rows=True):
    """``softmax(query @ key^T * scale + bias) @ value`` as one node (no argument checks).

    ``bias`` is an additive float mask broadcastable to the scores ``(..., L, S)``
    (``-inf`` where attention is not allowed); it gets a gradient if it requires one.
    With ``need_weights`` returns ``(output, weights)``, the weights after dropout.
    """
    q, k, v = array_of(query), array_of(key), array_of(value)
    scores = np.matmul(q, np.swapaxes(k, -1, -2))
    scores *= scores.dtype.type(scale)
    if bias is not None:
        if np.broadcast_shapes(scores.shape, array_of(bias).shape) == scores.shape:
            scores += array_of(bias)
        else:
            scores = scores + array_of(bias)
    probs = _softmax_rows(scores, zero_masked_rows)
    drop = dropout_keep_mask(probs.shape, probs.dtype, dropout_p) if dropout_p > 0 else None
    dropped = probs if drop is None else probs * drop
    out = np.matmul(dropped, v)
    meta = {"scale": scale, "drop": drop, "zero_masked_rows": zero_masked_rows}
    inputs = (query, key, value, bias)
    saved = (query, key, value, wrap(probs)) + ((bias,) if bias is not None else ())
    if not need_weights:
        return record(ScaledDotProductAttentionBackward, out, inputs, saved, meta)
    # The returned weights are a copy: writing to them in place must not change the
    # probabilities the backward uses.
    weights = dropped.copy() if drop is None else dropped
    return tuple(record_multi(ScaledDotProductAttentionBackward, (out, weights), inputs, saved,
                              meta))


def _check_mask_dtype(attn_mask, query):
    dt = array_of(attn_mask).dtype
    if dt != np.bool_ and dt != np.float32 and dt != array_of(query).dtype:
        raise RuntimeError(f"Expected attn_mask dtype to be bool or float or to match query "
                           f"dtype, but got attn_mask.dtype: {attn_mask.dtype} and  query.dtype: "
                           f"{query.dtype} instead.")


def causal_bias(target_len, source_len, dtype):
    """``0`` on and below the diagonal of ``(L, S)``, ``-inf`` above: query i sees keys <= i."""
    keep = np.tril(np.ones((target_len, source_len), dtype=bool))
    return wrap(np.where(keep, 0, -np.inf).astype(dtype))


def _additive_mask(attn_mask, is_causal, target_len, source_len, dtype):
    """One float bias from SDPA's masks: bool ``True`` means *take part*."""
    bias = causal_bias(target_len, source_len, dtype) if is_causal else None
    if attn_mask is not None:
        m = array_of(attn_mask)
        if m.dtype == np.bool_:
            mask = wrap(np.where(m, 0, -np.inf).astype(dtype))
        else:
            mask = attn_mask if m.dtype == dtype else \
                conversion.to(attn_mask, _dt.from_numpy_dtype(dtype))
        bias = mask if bias is None else mask + bias
    return bias


def scaled_dot_product_attention(query, key, value, attn_mask=None, dropout_p=0.0,
                                 is_causal=False, scale=None, enable_gqa=False):
    """``torch.nn.functional.scaled_dot_product_attention``: query ``(..., L, E)``, key
    ``(..., S, E)``, value ``(..., S, Ev)`` -> ``(..., L, Ev)``.

    A bool ``attn_mask`` marks the positions that take part (``True``); a float one is
    added to the scores. ``is_causal`` keeps the lower triangle of the ``(L, S)``
    scores (not together with ``attn_mask``). A row with nothing to attend to gives
    zeros, as PyTorch's does.
    """
    qd, kd, vd = array_of(query), array_of(key), array_of(value)
    if qd.ndim < 2 or kd.ndim < 2 or vd.ndim < 2:
        raise RuntimeError(f"Expected query, key, and value to all be  at least 2 dimensional, "
                           f"but got query.dim: {qd.ndim} key.dim: {kd.ndim} and value.dim: "
                           f"{vd.ndim} instead.")
    if not (qd.dtype == kd.dtype == vd.dtype):
        raise RuntimeError(f"Expected query, key, and value to have the same dtype, but got "
                           f"query.dtype: {query.dtype} key.dtype: {key.dtype} and value.dtype: "
                           f"{value.dtype} instead.")
    if qd.dtype.kind != "f":
        raise RuntimeError(f"scaled_dot_product_attention: expected a floating point query, "
                           f"got {query.dtype}")
    if not 0.0 <= dropout_p <= 1.0:
        raise RuntimeError(f"dropout probability has to be between 0 and 1, but got {dropout_p}")
    if qd.shape[-1] != kd.shape[-1]:
        raise RuntimeError(f"scaled_dot_product_attention: the last dimension of query "
                           f"({qd.shape[-1]}) and key ({kd.shape[-1]}) must match")
    if kd.shape[-2] != vd.shape[-2]:
        raise RuntimeError(f"scaled_dot_product_attention: key and value must have the same "
                           f"sequence length, got {kd.shape[-2]} and {vd.shape[-2]}")
    if enable_gqa:
        key, value = _repeat_kv_heads(query, key, value)
    target_len, source_len = qd.shape[-2], kd.shape[-2]
    if attn_mask is not None and is_causal:
        # PyTorch's documented contract (its CPU flash kernel would apply both).
        raise RuntimeError("_scaled_dot_product_attention: Explicit attn_mask should not be set "
                           "when is_causal=True")
    if attn_mask is not None:
        _check_mask_dtype(attn_mask, query)
        scores_shape = np.broadcast_shapes(qd.shape[:-2], kd.shape[:-2]) + (target_len, source_len)
        try:
            np.broadcast_shapes(scores_shape, array_of(attn_mask).shape)
        except ValueError:
            raise RuntimeError(f"scaled_dot_product_attention: attn_mask of shape "
                               f"{list(array_of(attn_mask).shape)} does not broadcast to the "
                               f"attention scores of shape {list(scores_shape)}") from None
    if scale is None:
        scale = 1.0 / math.sqrt(qd.shape[-1])
    bias = _additive_mask(attn_mask, is_causal, target_len, source_len, qd.dtype)
    try:
        return attention(query, key, value, bias, scale, dropout_p)
    except ValueError:  # batch dimensions that do not broadcast, as NumPy reports them
        raise RuntimeError(f"scaled_dot_product_attention: the batch dimensions of query "
                           f"{list(qd.shape[:-2])}, key {list(kd.shape[:-2])} and value "
                           f"{list(vd.shape[:-2])} do not broadcast") from None


def _repeat_kv_heads(query, key, value):
    """Grouped-query attention: each key/value head serves ``Hq / Hkv`` query heads."""
    hq, hk, hv = array_of(query).shape[-3], array_of(key).shape[-3], array_of(value).shape[-3]
    if hk != hv or hq % hk:
        raise RuntimeError(f"scaled_dot_product_attention: with enable_gqa the number of query "
                           f"heads ({hq}) must be a multiple of the key/value heads ({hk}, {hv})")
    reps = hq // hk
    if reps == 1:
        return key, value
    return _interleave(key, reps), _interleave(value, reps)


def _interleave(t, reps):
    """Repeat each head ``reps`` times in a row along dim -3 (``repeat_interleave``)."""
    d = array_of(t).shape
    expanded = shape.unsqueeze(t, -3).expand(*d[:-3], d[-3], reps, d[-2], d[-1])
    return expanded.reshape(*d[:-3], d[-3] * reps, d[-2], d[-1])

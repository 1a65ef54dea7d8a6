"""Multi-head attention as a function: ``torch.nn.functional.multi_head_attention_forward``.

The steps, argument checks and exception classes are PyTorch's (in-projection,
``bias_k``/``bias_v``, ``add_zero_attn``, masks merged into one additive bias,
out-projection). The difference is the layout in between: heads are split as
views ``(N, H, L, head_dim)`` straight from the projection, in either batch
layout, and the attention core is one fused node (``ops/attention.py``). With
``need_weights`` a row whose keys are all masked gives NaN, as PyTorch's softmax
does; without, zeros, as its ``scaled_dot_product_attention`` does.
"""
import math
import warnings

import numpy as np

from .._tensor import Tensor
from ..ops import shape
from ..ops.attention import attention, causal_bias
from ..ops.linalg import linear
from ..autograd._internal import array_of, wrap

__all__ = ["multi_head_attention_forward", "canonical_mask"]


def canonical_mask(mask, mask_name, other_type, other_name, target_type, check_other=True):
    """A float mask to add to the scores: a bool mask's ``True`` becomes ``-inf``.

    PyTorch's ``F._canonical_mask``; ``other_type`` is the dtype of the mask it is
    used with (or None), which should match.
    """
    if mask is None:
        return None
    dt = array_of(mask).dtype
    if dt != np.bool_ and dt.kind != "f":
        raise AssertionError(f"only bool and floating types of {mask_name} are supported")
    if check_other and other_type is not None and mask.dtype != other_type:
        warnings.warn(f"Support for mismatched {mask_name} and {other_name} is deprecated. Use "
                      "same type for both instead.", stacklevel=3)
    if dt == np.bool_:
        return wrap(np.where(array_of(mask), -np.inf, 0).astype(target_type.numpy))
    return mask


def none_or_dtype(input):
    """PyTorch's ``F._none_or_dtype``."""
    if input is None:
        return None
    if isinstance(input, Tensor):
        return input.dtype
    raise RuntimeError("input to _none_or_dtype() must be None or torch.Tensor")


def _shape_check(query, key, value, key_padding_mask, attn_mask, num_heads):
    """Whether the input is batched; PyTorch's ``_mha_shape_check`` (AssertionError)."""
    n = query.dim()
    if n not in (2, 3):
        raise AssertionError("query should be unbatched 2D or batched 3D tensor but received "
                             f"{n}-D query tensor")
    kind = "batched (3-D)" if n == 3 else "unbatched (2-D)"
    if key.dim() != n or value.dim() != n:
        raise AssertionError(f"For {kind} `query`, expected `key` and `value` to be {n}-D but "
                             f"found {key.dim()}-D and {value.dim()}-D tensors respectively")
    if key_padding_mask is not None and key_padding_mask.dim() != n - 1:
        raise AssertionError(f"For {kind} `query`, expected `key_padding_mask` to be `None` or "
                             f"{n - 1}-D but found {key_padding_mask.dim()}-D tensor instead")
    if attn_mask is not None:
        if attn_mask.dim() not in (2, 3):
            raise AssertionError(f"For {kind} `query`, expected `attn_mask` to be `None`, 2-D or "
                                 f"3-D but found {attn_mask.dim()}-D tensor instead")
        expected = (num_heads, query.shape[0], key.shape[0])
        if n == 2 and attn_mask.dim() == 3 and tuple(attn_mask.shape) != expected:
            raise AssertionError(f"Expected `attn_mask` shape to be {expected} but got "
                                 f"{attn_mask.shape}")
    return n == 3


class _Layout:
    """Where batch and sequence live: ``(N, L, E)`` with batch_first, else ``(L, N, E)``."""

    def __init__(self, batch_first):
        self.batch_first = batch_first

    def sizes(self, x):
        """(batch, length) of a ``(., ., E)`` tensor."""
        a, b = array_of(x).shape[:2]
        return (a, b) if self.batch_first else (b, a)

    def to_heads(self, x, num_heads, parts=1):
        """``(., ., parts*E)`` -> ``parts`` views of shape ``(N, H, L, head_dim)``."""
        a, b, width = array_of(x).shape
        x = shape.reshape(x, (a, b, parts, num_heads, width // (parts * num_heads)))
        # (a, b, parts, H, d) -> (parts, N, H, L, d)
        x = shape.permute(x, 2, 0, 3, 1, 4) if self.batch_first else shape.permute(x, 2, 1, 3, 0, 4)
        return shape.unbind(x, 0) if parts > 1 else (shape.squeeze(x, 0),)

    def from_heads(self, x):
        """``(N, H, L, head_dim)`` -> ``(., ., E)`` in this layout."""
        n, h, length, d = array_of(x).shape
        x = shape.permute(x, 0, 2, 1, 3) if self.batch_first else shape.permute(x, 2, 0, 1, 3)
        return shape.reshape(x, array_of(x).shape[:2] + (h * d,))


def _in_projection(query, key, value, layout, num_heads, in_proj_weight, in_proj_bias,
                   separate_weights):
    """q, k, v in head layout ``(N, H, len, head_dim)``. One matmul for self-attention and
    one for key+value when they are the same tensor, as PyTorch packs them."""
    e = array_of(query).shape[-1]
    if separate_weights is not None:
        w_q, w_k, w_v = separate_weights
        b_q = b_k = b_v = None
        if in_proj_bias is not None:
            b_q, b_k, b_v = shape.chunk(in_proj_bias, 3)
        _check_projection(query, key, value, w_q, w_k, w_v, b_q, b_k, b_v)
        return (layout.to_heads(linear(query, w_q, b_q), num_heads)[0],
                layout.to_heads(linear(key, w_k, b_k), num_heads)[0],
                layout.to_heads(linear(value, w_v, b_v), num_heads)[0])
    if key is value and query is key:
        return layout.to_heads(linear(query, in_proj_weight, in_proj_bias), num_heads, 3)
    if key is value:
        w_q, w_kv = shape.split(in_proj_weight, [e, 2 * e])
        b_q = b_kv = None
        if in_proj_bias is not None:
            b_q, b_kv = shape.split(in_proj_bias, [e, 2 * e])
        k, v = layout.to_heads(linear(key, w_kv, b_kv), num_heads, 2)
        return layout.to_heads(linear(query, w_q, b_q), num_heads)[0], k, v
    w_q, w_k, w_v = shape.chunk(in_proj_weight, 3)
    b_q = b_k = b_v = None
    if in_proj_bias is not None:
        b_q, b_k, b_v = shape.chunk(in_proj_bias, 3)
    return (layout.to_heads(linear(query, w_q, b_q), num_heads)[0],
            layout.to_heads(linear(key, w_k, b_k), num_heads)[0],
            layout.to_heads(linear(value, w_v, b_v), num_heads)[0])


def _check_projection(q, k, v, w_q, w_k, w_v, b_q, b_k, b_v):
    eq, ek, ev = q.shape[-1], k.shape[-1], v.shape[-1]
    for name, w, expected in (("query", w_q, (eq, eq)), ("key", w_k, (eq, ek)),
                              ("value", w_v, (eq, ev))):
        if tuple(w.shape) != expected:
            raise AssertionError(f"expecting {name} weights shape of {expected}, but got "
                                 f"{tuple(w.shape)}")
    for name, b in (("query", b_q), ("key", b_k), ("value", b_v)):
        if b is not None and tuple(b.shape) != (eq,):
            raise AssertionError(f"expecting {name} bias shape of {(eq,)}, but got "
                                 f"{tuple(b.shape)}")


def _pad_last(mask):
    """One more key position that takes part (PyTorch's ``pad(mask, (0, 1))``)."""
    if mask is None:
        return None
    zeros = wrap(np.zeros(array_of(mask).shape[:-1] + (1,), dtype=array_of(mask).dtype))
    return shape.cat([mask, zeros], -1)


def _append_key(x, row):
    """Append one key/value position to ``(N, H, S, d)``; ``row`` broadcasts to (N, H, 1, d)."""
    n, h, _, d = array_of(x).shape
    return shape.cat([x, shape.expand(row, n, h, 1, d)], 2)


def _static(t, name, batch, num_heads, head_dim):
    if array_of(t).shape[0] != batch * num_heads:
        raise AssertionError(f"expecting {name}.size(0) of {batch * num_heads}, but got "
                             f"{array_of(t).shape[0]}")
    if array_of(t).shape[2] != head_dim:
        raise AssertionError(f"expecting {name}.size(2) of {head_dim}, but got {array_of(t).shape[2]}")
    return shape.reshape(t, (batch, num_heads, array_of(t).shape[1], head_dim))


def multi_head_attention_forward(query, key, value, embed_dim_to_check, num_heads, in_proj_weight,
                                 in_proj_bias, bias_k, bias_v, add_zero_attn, dropout_p,
                                 out_proj_weight, out_proj_bias, training=True,
                                 key_padding_mask=None, need_weights=True, attn_mask=None,
                                 use_separate_proj_weight=False, q_proj_weight=None,
                                 k_proj_weight=None, v_proj_weight=None, static_k=None,
                                 static_v=None, average_attn_weights=True, is_causal=False,
                                 batch_first=False):
    """``(attn_output, attn_weights or None)`` for query ``(L, N, E)``, key/value
    ``(S, N, E)`` (``(N, ., E)`` with ``batch_first``, a distgrad extension the module
    uses to skip two transposes), or unbatched ``(L, E)``/``(S, E)``."""
    batched = _shape_check(query, key, value, key_padding_mask, attn_mask, num_heads)
    layout = _Layout(batch_first)
    if not batched:
        batch_dim = 0 if batch_first else 1
        # Keep self-attention recognisable (query is key is value): one packed projection.
        same_kv, same_qk = value is key, key is query
        query = shape.unsqueeze(query, batch_dim)
        key = query if same_qk else shape.unsqueeze(key, batch_dim)
        value = key if same_kv else shape.unsqueeze(value, batch_dim)
        if key_padding_mask is not None:
            key_padding_mask = shape.unsqueeze(key_padding_mask, 0)
    bsz, tgt_len = layout.sizes(query)
    embed_dim = array_of(query).shape[-1]
    src_len = layout.sizes(key)[1]
    key_padding_mask = canonical_mask(key_padding_mask, "key_padding_mask",
                                      none_or_dtype(attn_mask), "attn_mask", query.dtype)
    if is_causal and attn_mask is None:
        raise RuntimeError("Need attn_mask if specifying the is_causal hint. You may use the "
                           "Transformer module method `generate_square_subsequent_mask` to "
                           "create this mask.")
    if is_causal and key_padding_mask is None and not need_weights:
        attn_mask = None  # the hint alone drives the causal attention
    else:
        attn_mask = canonical_mask(attn_mask, "attn_mask", None, "", query.dtype,
                                   check_other=False)
        if key_padding_mask is not None:
            is_causal = False  # merged with padding, the mask is no longer causal
    if embed_dim != embed_dim_to_check:
        raise AssertionError(f"was expecting embedding dimension of {embed_dim_to_check}, but "
                             f"got {embed_dim}")
    head_dim = embed_dim // num_heads
    if head_dim * num_heads != embed_dim:
        raise AssertionError(f"embed_dim {embed_dim} not divisible by num_heads {num_heads}")
    if use_separate_proj_weight:
        if array_of(key).shape[:2] != array_of(value).shape[:2]:
            raise AssertionError(f"key's sequence and batch dims {key.shape[:2]} do not match "
                                 f"value's {value.shape[:2]}")
        for name, w in (("q", q_proj_weight), ("k", k_proj_weight), ("v", v_proj_weight)):
            if w is None:
                raise AssertionError(f"use_separate_proj_weight is True but {name}_proj_weight "
                                     "is None")
        separate = (q_proj_weight, k_proj_weight, v_proj_weight)
    else:
        if array_of(key).shape != array_of(value).shape:
            raise AssertionError(f"key shape {key.shape} does not match value shape "
                                 f"{value.shape}")
        if in_proj_weight is None:
            raise AssertionError("use_separate_proj_weight is False but in_proj_weight is None")
        separate = None
    q, k, v = _in_projection(query, key, value, layout, num_heads, in_proj_weight, in_proj_bias,
                             separate)

    if attn_mask is not None:
        if attn_mask.dim() == 2:
            if tuple(attn_mask.shape) != (tgt_len, src_len):
                raise RuntimeError(f"The shape of the 2D attn_mask is {attn_mask.shape}, but "
                                   f"should be {(tgt_len, src_len)}.")
        elif attn_mask.dim() == 3:
            if tuple(attn_mask.shape) != (bsz * num_heads, tgt_len, src_len):
                raise RuntimeError(f"The shape of the 3D attn_mask is {attn_mask.shape}, but "
                                   f"should be {(bsz * num_heads, tgt_len, src_len)}.")
            attn_mask = shape.reshape(attn_mask, (bsz, num_heads, tgt_len, src_len))
        else:
            raise RuntimeError(f"attn_mask's dimension {attn_mask.dim()} is not supported")

    if bias_k is not None and bias_v is not None:
        if static_k is not None:
            raise AssertionError("bias cannot be added to static key.")
        if static_v is not None:
            raise AssertionError("bias cannot be added to static value.")
        k = _append_key(k, shape.reshape(bias_k, (1, num_heads, 1, head_dim)))
        v = _append_key(v, shape.reshape(bias_v, (1, num_heads, 1, head_dim)))
        attn_mask, key_padding_mask = _pad_last(attn_mask), _pad_last(key_padding_mask)
    elif bias_k is not None:
        raise AssertionError("bias_k is set but bias_v is None")
    elif bias_v is not None:
        raise AssertionError("bias_v is set but bias_k is None")
    if static_k is not None:
        k = _static(static_k, "static_k", bsz, num_heads, head_dim)
    if static_v is not None:
        v = _static(static_v, "static_v", bsz, num_heads, head_dim)
    if add_zero_attn:
        k = _append_key(k, wrap(np.zeros((1, 1, 1, head_dim), dtype=array_of(k).dtype)))
        v = _append_key(v, wrap(np.zeros((1, 1, 1, head_dim), dtype=array_of(v).dtype)))
        attn_mask, key_padding_mask = _pad_last(attn_mask), _pad_last(key_padding_mask)
    src_len = array_of(k).shape[2]

    if key_padding_mask is not None:
        if array_of(key_padding_mask).shape[0] != bsz:
            raise AssertionError(f"Expected key_padded_mask.shape[0] to be {bsz}, but got "
                                 f"{array_of(key_padding_mask).shape[0]}")
        if array_of(key_padding_mask).shape[1] != src_len:
            raise AssertionError(f"Expected key_padded_mask.shape[1] to be {src_len}, but got "
                                 f"{array_of(key_padding_mask).shape[1]}")
        key_padding_mask = shape.reshape(key_padding_mask, (bsz, 1, 1, src_len))
        attn_mask = key_padding_mask if attn_mask is None else attn_mask + key_padding_mask
    if not training:
        dropout_p = 0.0
    if need_weights and is_causal and attn_mask is None:
        raise AssertionError("FIXME: is_causal not implemented for need_weights")
    if is_causal and attn_mask is None:
        attn_mask = causal_bias(tgt_len, src_len, array_of(q).dtype)
    out = attention(q, k, v, attn_mask, 1.0 / math.sqrt(head_dim), dropout_p,
                    need_weights=need_weights, zero_masked_rows=not need_weights)
    weights = None
    if need_weights:
        out, weights = out
        if average_attn_weights:
            weights = weights.mean(dim=1)
        if not batched:
            weights = shape.squeeze(weights, 0)
    out = linear(layout.from_heads(out), out_proj_weight, out_proj_bias)
    if not batched:
        out = shape.squeeze(out, 0 if batch_first else 1)
    return out, weights

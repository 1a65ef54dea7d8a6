"""Embedding bags: sums, means or maxima of embedding rows per bag, as one node.

A bag is a run of consecutive indices. Rows are gathered once and reduced per
bag with ``reduceat`` (bags are contiguous and in order); the backward scatters
the bag gradients back onto the rows of ``weight`` that took part: all of them
for sum/mean (scaled by the per-sample weight or ``1 / bag size``), the winning
row of each feature for max. Indices equal to ``padding_idx`` take no part.
"""
import numpy as np
from ..autograd._internal import array_of, defop, record


__all__ = ["embedding_bag"]

MODES = ("sum", "mean", "max")


def row_gradients(xp, g, m, per_sample_weights=None):
    """sum/mean: the gradient of the weight row each index looked up (``m["indices"]``),
    before rows of the same index are added up."""
    rows = xp.take(g, (m["bags"],)) * m["row_scale"]
    if per_sample_weights is not None:
        rows = rows * xp.expand_dims(xp.take(per_sample_weights, (m["kept"],)), -1)
    return rows


def _embedding_bag_vjp_all(xp, grads, m, needs, weight=None, per_sample_weights=None):
    g = grads[0]
    need_weight, need_psw = needs
    grad_weight = grad_psw = None
    if need_weight:
        if m["mode"] == "max":
            winners = xp.take(g, (m["nonempty"],))
            grad_weight = xp.index_add(m["weight_shape"], m["winner_key"], winners, True)
        else:
            grad_weight = xp.index_add(m["weight_shape"], (m["indices"],),
                                       row_gradients(xp, g, m, per_sample_weights), True)
    if need_psw:
        grad_psw = per_sample_weights_gradient(xp, g, m, weight)
    return grad_weight, grad_psw


def per_sample_weights_gradient(xp, g, m, weight):
    rows = xp.take(weight, (m["indices"],))
    kept = xp.sum(xp.take(g, (m["bags"],)) * rows, axis=-1)
    return xp.index_add(m["psw_shape"], (m["kept"],), kept, False)


EmbeddingBagBackward0 = defop("EmbeddingBagBackward0", saved=("weight", "per_sample_weights"),
                              vjp_all=_embedding_bag_vjp_all)


def embedding_bag(weight, indices, bag_of, num_bags, mode="mean", per_sample_weights=None,
                  padding_idx=None, grad_scale=None, node=EmbeddingBagBackward0):
    """``(num_bags, D)``: bag ``b`` reduces ``weight[indices[bag_of == b]]``.

    ``indices`` and ``bag_of`` are int arrays of the same length, ``bag_of``
    non-decreasing (``-1``: in no bag); ``grad_scale`` (per index, optional) multiplies
    the gradient each index's row gets (sum/mean). ``node``: the gradient rule (another
    one reads the same saved values: the sparse gradient of ``distgrad.sparse``). No
    argument checks here (``nn.functional.embedding_bag`` does them).
    """
    w = array_of(weight)
    taking_part = bag_of >= 0
    if padding_idx is not None:
        taking_part &= indices != padding_idx
    kept = np.flatnonzero(taking_part)
    idx, bags = indices[kept], bag_of[kept]
    rows = w[idx]
    if per_sample_weights is not None:
        rows = rows * array_of(per_sample_weights)[kept][:, None]
    counts = np.bincount(bags, minlength=num_bags)
    nonempty = np.flatnonzero(counts)
    starts = (np.cumsum(counts) - counts)[nonempty]
    out = np.zeros((num_bags, w.shape[1]), dtype=w.dtype)
    meta = {"mode": mode, "weight_shape": w.shape, "bags": bags, "indices": idx, "kept": kept,
            "nonempty": nonempty, "scaled_by_frequency": grad_scale is not None}
    if rows.shape[0]:
        reduce = np.maximum if mode == "max" else np.add
        out[nonempty] = reduce.reduceat(rows, starts, axis=0)
    if mode == "max":
        # The first row reaching each bag's maximum takes the gradient of that feature.
        position = np.where(rows == out[bags], np.arange(rows.shape[0])[:, None], rows.shape[0])
        first = np.minimum.reduceat(position, starts, axis=0) if rows.shape[0] else \
            np.zeros((0, w.shape[1]), dtype=np.int64)
        meta["winner_key"] = (idx[first], np.broadcast_to(np.arange(w.shape[1]), first.shape))
    else:
        scale = np.ones(idx.shape, dtype=w.dtype)
        if mode == "mean":
            out[nonempty] /= counts[nonempty, None].astype(w.dtype)
            scale /= counts[bags]
        if grad_scale is not None:
            scale *= grad_scale[kept]
        meta["row_scale"] = scale[:, None]
    saved = ()
    if per_sample_weights is not None:  # each one's gradient needs the other
        meta["psw_shape"] = array_of(per_sample_weights).shape
        saved = (weight, per_sample_weights)
    return record(node, out, (weight, per_sample_weights), saved, meta)

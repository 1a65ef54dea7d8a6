"""Sparse gradients of embeddings: ``nn.Embedding(sparse=True)`` and ``EmbeddingBag``.

With ``sparse=True`` PyTorch's weight gradient is a sparse COO tensor with one entry
per index looked up (uncoalesced: an index used twice appears twice), its row the
gradient that lookup brought; indices equal to ``padding_idx`` are left out. These
nodes read what the dense ones of ``nn.functional`` and ``ops/embedding_bag.py``
save, under the same names (``EmbeddingBackward0``, ``EmbeddingBagBackward0``).
"""
import numpy as np

from ..ops.embedding_bag import per_sample_weights_gradient, row_gradients
from ..ops.registry import defop
from .coo import COO, unsupported

__all__ = ["EmbeddingBackward0", "EmbeddingBagBackward0"]

_NO_FREQUENCY = "embedding_backward: scale_grad_by_freq not supported with sparse gradients"


def _rows_gradient(xp, indices, rows, shape):
    if xp.is_tensor_backend():
        raise unsupported("the gradient of the gradient of a sparse embedding "
                          "(create_graph=True)")
    indices = np.asarray(indices, dtype=np.int64).reshape(1, -1)
    return COO(indices, np.asarray(rows).reshape(indices.shape[1], -1), shape, False)


def _embedding_vjp(xp, g, m):
    if m["freq_scale"] is not None:
        raise RuntimeError(_NO_FREQUENCY)
    idx = m["key"][0].reshape(-1)
    rows = np.asarray(g).reshape(idx.size, -1)
    if m["padding_idx"] is not None:
        keep = idx != m["padding_idx"]
        idx, rows = idx[keep], rows[keep]
    return _rows_gradient(xp, idx, rows, m["shape"])


EmbeddingBackward0 = defop("EmbeddingBackward0", vjps=(_embedding_vjp,))


def _embedding_bag_vjp_all(xp, grads, m, needs, weight=None, per_sample_weights=None):
    need_weight, need_psw = needs
    grad_weight = None
    if need_weight:
        if m["scaled_by_frequency"]:
            raise RuntimeError(_NO_FREQUENCY)
        rows = row_gradients(xp, grads[0], m, per_sample_weights)
        grad_weight = _rows_gradient(xp, m["indices"], rows, m["weight_shape"])
    grad_psw = per_sample_weights_gradient(xp, grads[0], m, weight) if need_psw else None
    return grad_weight, grad_psw


EmbeddingBagBackward0 = defop("EmbeddingBagBackward0", saved=("weight", "per_sample_weights"),
                              vjp_all=_embedding_bag_vjp_all)

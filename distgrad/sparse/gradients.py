"""Sparse gradients of dense ops: embeddings with ``sparse=True`` and
``gather(..., sparse_grad=True)``.

There PyTorch's gradient is a sparse COO tensor with one entry per element looked
up (uncoalesced: an index used twice appears twice): for an embedding, the row the
lookup's gradient brought (indices equal to ``padding_idx`` left out); for gather,
each gradient element at the input position it was gathered from. These nodes read
what the dense ones (``nn.functional``, ``ops/embedding_bag.py``, ``ops/indexing.py``)
save, under the same names (``EmbeddingBackward0``, ``EmbeddingBagBackward0``,
``GatherBackward0``).
"""
import numpy as np

from ..ops import indexing
from ..ops.embedding_bag import per_sample_weights_gradient, row_gradients
from ..autograd._internal import defop
from .coo import COO, unsupported

__all__ = ["EmbeddingBackward0", "EmbeddingBagBackward0", "GatherBackward0"]

_NO_FREQUENCY = "embedding_backward: scale_grad_by_freq not supported with sparse gradients"


def _first_order(xp, what):
    if xp.is_tensor_backend():
        raise unsupported(f"the gradient of the gradient of {what} with a sparse gradient "
                          "(create_graph=True)")


def _rows_gradient(xp, indices, rows, shape):
    _first_order(xp, "an embedding")
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


def _gather_vjp(xp, g, m):
    """PyTorch's ``_gather_sparse_backward``: an entry per gradient element, at the
    input position it came from (its own coordinates, the index along ``dim``)."""
    _first_order(xp, "gather")
    g = np.asarray(g)
    coords = np.indices(g.shape, dtype=np.int64).reshape(g.ndim, -1)
    coords[m["dim"]] = np.asarray(m["index"], dtype=np.int64).reshape(-1)
    return COO(coords, g.reshape(-1), m["shape"], False)


GatherBackward0 = defop("GatherBackward0", vjps=(_gather_vjp,))
indexing.SPARSE_GRAD_NODES["gather"] = GatherBackward0

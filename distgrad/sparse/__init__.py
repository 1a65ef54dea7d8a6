"""``torch.sparse`` for distgrad: sparse COO tensors and the ops made for them.

>>> import distgrad
>>> s = distgrad.sparse_coo_tensor([[0, 1, 1], [2, 0, 2]], [3.0, 4.0, 5.0], (2, 3),
...                                requires_grad=True)
>>> loss = distgrad.sparse.sum(s * s)
>>> loss.backward()
>>> s.grad.to_dense()
tensor([[ 0.,  0.,  6.],
        [ 8.,  0., 10.]])

A sparse tensor is a :class:`~distgrad.Tensor` (``is_sparse``, ``layout``) whose
storage is a :class:`~distgrad.sparse.coo.COO` array; see ``coo.py`` for the ops
every tensor has that work on it (``add``, ``sub``, ``mul``, ``stack``, ``cat``,
``mm``, ...) and ``functions.py`` for the sparse-only ones. Unsupported ops raise
``NotImplementedError``; nothing is made dense unless ``to_dense()`` is called.
"""
from . import gradients  # noqa: F401 - sparse gradients of embeddings and gather
from .coo import COO  # noqa: F401
from . import coo_arithmetic, coo_array_functions  # noqa: F401 - they fill COO's tables
from .functions import mm, sparse_coo_tensor, sum  # noqa: A004, F401
from .layout import layout, sparse_coo, strided  # noqa: F401

__all__ = ["sum", "mm"]

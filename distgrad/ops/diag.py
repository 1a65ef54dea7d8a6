"""Diagonals: ``diag``, ``diag_embed``, ``diagflat``, copies with PyTorch's nodes.

``diag`` of a vector puts it on the ``diagonal``-th diagonal of a square matrix
(``DiagEmbedBackward0``: the gradient is that diagonal of the gradient); of a matrix
it copies that diagonal out (``DiagonalBackward0_copy``: the gradient is put back on
it, zeros elsewhere). The rules index with the backend's ``take``/``index_add``, so
gradients of gradients work too.

>>> import distgrad
>>> distgrad.diag(distgrad.tensor([1, 2]))
tensor([[1, 0],
        [0, 2]])
>>> distgrad.diag(distgrad.arange(9).reshape(3, 3), 1)
tensor([1, 5])
"""
import numpy as np

from ..autograd._internal import array_of, defop, record

__all__ = ["diag", "diag_embed", "diagflat"]


def _positions(n_rows, n_cols, offset):
    """Row and column indices of diagonal ``offset`` of an ``n_rows x n_cols`` matrix."""
    start_row, start_col = (0, offset) if offset >= 0 else (-offset, 0)
    length = max(0, min(n_rows - start_row, n_cols - start_col))
    rows = np.arange(start_row, start_row + length)
    return rows, rows - start_row + start_col


DiagEmbedBackward0 = defop("DiagEmbedBackward0", vjps=(
    lambda xp, g, m: xp.take(g, (Ellipsis,) + m["key"]),))
DiagonalBackward0_copy = defop("DiagonalBackward0_copy", vjps=(
    lambda xp, g, m: xp.index_add(m["shape"], m["key"], g, False),))


def diag_embed(input, offset=0, dim1=-2, dim2=-1):
    """A batch of matrices with the last dimension of ``input`` on diagonal ``offset``."""
    if (dim1 % (input.dim() + 1), dim2 % (input.dim() + 1)) != (input.dim() - 1, input.dim()):
        raise NotImplementedError("diag_embed: only dim1=-2, dim2=-1 (the last two dimensions "
                                  "of the result) are supported by distgrad")
    d = array_of(input)
    n = d.shape[-1] + abs(offset)
    key = _positions(n, n, offset)
    out = np.zeros(d.shape[:-1] + (n, n), dtype=d.dtype)
    out[(Ellipsis,) + key] = d
    return record(DiagEmbedBackward0, out, (input,), (), {"key": key})


def diag(input, diagonal=0):
    """A vector on a diagonal of a square matrix, or a matrix's diagonal as a vector."""
    d = array_of(input)
    if d.ndim == 1:
        return diag_embed(input, diagonal)
    if d.ndim != 2:
        raise RuntimeError(f"diag(): Supports 1D or 2D tensors. Got {d.ndim}D")
    key = _positions(d.shape[0], d.shape[1], diagonal)
    return record(DiagonalBackward0_copy, d[key], (input,), (),
                  {"shape": d.shape, "key": key})


def diagflat(input, offset=0):
    """``input`` flattened, on diagonal ``offset`` of a square matrix."""
    return diag_embed(input.reshape(-1) if input.dim() != 1 else input, offset)

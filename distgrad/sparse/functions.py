"""Sparse COO tensors: construction, conversion, the sparse-only ops, their gradients.

The ops every tensor has (``add``, ``mul``, ``stack``, ``mm``, ...) handle sparse
operands through the :class:`~distgrad.sparse.coo.COO` array itself; what lives
here is what only sparse tensors have, each with PyTorch's node and gradient
layout:

* ``sparse_coo_tensor`` (a leaf, or differentiable in ``values``), ``to_sparse``
  (``ToSparseBackward1``: a dense gradient), ``to_dense`` (``ToDenseBackward0``: a
  sparse gradient on the input's entries), ``coalesce`` (``CoalesceBackward0``),
  ``values`` (``ValuesBackward0``), and the non-differentiable views ``_values``,
  ``_indices``;
* ``torch.sparse.sum`` (``SumBackward0`` / ``SparseSumBackward0``) and
  ``torch.sparse.mm`` (``SparseAddmmBackward0``): their gradient for the sparse
  input is sparse, on the input's entries.

Gradients of these gradients (``create_graph=True``) are not supported: their
rules raise instead of computing something else.
"""
import numpy as np

from ..autograd import dtype as _dt
from ..autograd.device import as_cpu_device
from ..autograd._internal import TensorBase, array_of, as_array, defop, record, wrap
from .coo import COO, _linear, from_dense, unsupported
from .coo_arithmetic import _gather
from .layout import sparse_coo, strided

__all__ = ["sparse_coo_tensor", "is_sparse", "sum", "mm", "SparseMethods"]


def is_sparse(t):
    return isinstance(array_of(t), COO)


def _storage(t, what):
    data = array_of(t)
    if not isinstance(data, COO):
        raise RuntimeError(f"{what} expected sparse coordinate tensor layout but got Strided")
    return data


def _first_order(xp, what):
    if xp.is_tensor_backend():
        raise unsupported(f"the gradient of the gradient of {what} (create_graph=True)")


def _array(x):
    return array_of(x) if isinstance(x, TensorBase) else x


def _to_dense_array(g):
    return g.to_dense() if isinstance(g, COO) else g


# ---------------------------------------------------------------------- construction
def _values_vjp(xp, g, m):
    """Gradient of the values: the gradient at each entry's position."""
    _first_order(xp, "sparse_coo_tensor")
    indices = m["indices"]
    return _gather(g, indices) if isinstance(g, COO) else g[tuple(indices)]


SparseCooTensorWithDimsAndTensorsBackward0 = defop(
    "SparseCooTensorWithDimsAndTensorsBackward0", vjps=(_values_vjp,))


def _index_array(indices):
    idx = _array(indices)
    idx = np.asarray(idx) if not isinstance(idx, np.ndarray) else idx
    if idx.dtype.kind not in "iu" and idx.size:
        raise RuntimeError(f"indices must be an int64 tensor (got {idx.dtype})")
    idx = idx.astype(np.int64, copy=False)
    if idx.ndim != 2:
        raise RuntimeError(f"indices must be sparse_dim x nnz, but got: {list(idx.shape)}")
    return idx


def _check(idx, values, shape):
    sparse_dim, dense_dim = idx.shape[0], values.ndim - 1
    if idx.shape[1] != values.shape[0]:
        raise RuntimeError(f"indices and values must have same nnz, but got nnz from indices: "
                           f"{idx.shape[1]}, nnz from values: {values.shape[0]}")
    if len(shape) != sparse_dim + dense_dim:
        raise RuntimeError(f"number of dimensions must be sparse_dim ({sparse_dim}) + dense_dim "
                           f"({dense_dim}), but got {len(shape)}")
    if tuple(values.shape[1:]) != tuple(shape[sparse_dim:]):
        raise RuntimeError(f"values has incorrect size, expected {list(shape[sparse_dim:])}, "
                           f"got {list(values.shape[1:])}")
    if idx.size:
        low, high = idx.min(axis=1), idx.max(axis=1)
        for d in range(sparse_dim):
            if low[d] < 0:
                raise RuntimeError(f"found negative index {low[d]} for dim {d}")
            if high[d] >= shape[d]:
                raise RuntimeError(f"size is inconsistent with indices: for dim {d}, size is "
                                   f"{shape[d]} but found index {high[d]}")


def sparse_coo_tensor(indices, values, size=None, *, dtype=None, device=None, pin_memory=False,
                      requires_grad=False, check_invariants=None, is_coalesced=None):
    """A sparse COO tensor with ``values`` at ``indices`` (``sparse_dim x nnz``), as
    ``torch.sparse_coo_tensor``; every index is checked against ``size``.

    >>> import distgrad
    >>> s = distgrad.sparse_coo_tensor([[0, 1], [2, 0]], [3.0, 4.0], (2, 3))
    >>> s.to_dense()
    tensor([[0., 0., 3.],
            [4., 0., 0.]])
    """
    as_cpu_device(device)
    idx = _index_array(indices)
    if isinstance(values, TensorBase):
        source = values
        vals = array_of(values) if dtype is None else \
            array_of(values).astype(_dt.to_numpy_dtype(dtype))
    else:
        source = None
        vals = as_array(values, dtype)
    if vals.ndim == 0:
        raise RuntimeError("values must be at least 1-dimensional (one value per entry)")
    if size is None:
        sparse_shape = tuple(int(m) + 1 for m in idx.max(axis=1)) if idx.shape[1] else \
            (0,) * idx.shape[0]
        shape = sparse_shape + tuple(vals.shape[1:])
    else:
        shape = tuple(int(s) for s in size)
    _check(idx, vals, shape)
    coalesced = False
    if is_coalesced:
        linear = _linear(idx, shape)
        if not np.all(linear[1:] > linear[:-1]):
            raise RuntimeError("sparse_coo_tensor: is_coalesced=True, but the indices are not "
                               "sorted and unique")
        coalesced = True
    data = COO(idx, vals, shape, coalesced)
    if source is not None and source.requires_grad:
        return record(SparseCooTensorWithDimsAndTensorsBackward0, data, (source,), (),
                      {"indices": idx})
    t = wrap(data)
    if requires_grad:
        t.requires_grad_(True)
    return t


# ---------------------------------------------------------------------- conversions
ToSparseBackward1 = defop("ToSparseBackward1", vjps=(
    lambda xp, g, m: _to_dense_array(g) if not xp.is_tensor_backend() else
    _first_order(xp, "to_sparse"),))


def to_sparse(self, sparse_dim=None, *, layout=None, blocksize=None, dense_dim=None):
    """This tensor as a coalesced sparse COO tensor (its non-zero entries)."""
    if layout is not None and str(layout) not in ("torch.sparse_coo", "distgrad.sparse_coo"):
        raise unsupported(f"to_sparse(layout={layout}) (only sparse COO tensors exist here)")
    if blocksize is not None or dense_dim is not None:
        raise unsupported("to_sparse with blocksize or dense_dim")
    if is_sparse(self):
        return self
    d = array_of(self)
    if sparse_dim is not None and not 0 < sparse_dim <= d.ndim:
        raise RuntimeError(f"sparse_dim must be in [1, {d.ndim}], got {sparse_dim}")
    return record(ToSparseBackward1, from_dense(d, sparse_dim), (self,))


def _to_dense_vjp(xp, g, m, x):
    """The gradient at the input's entries (PyTorch: ``grad.sparse_mask(input)``)."""
    _first_order(xp, "to_dense")
    entries = x.coalesce()
    return COO(entries.indices, g[tuple(entries.indices)], entries.shape, True)


ToDenseBackward0 = defop("ToDenseBackward0", saved=("self",), vjps=(_to_dense_vjp,))


def to_dense(self, dtype=None, *, masked_grad=None):
    if not is_sparse(self):
        return self if dtype is None else self.to(dtype)
    out = array_of(self).to_dense()
    if dtype is not None:
        out = out.astype(_dt.to_numpy_dtype(dtype))
    return record(ToDenseBackward0, out, (self,), (self,))


CoalesceBackward0 = defop("CoalesceBackward0", vjps=(lambda xp, g, m: g,))


def coalesce(self):
    data = _storage(self, "coalesce")
    if data.coalesced:
        return self
    return record(CoalesceBackward0, data.coalesce(), (self,))


def is_coalesced(self):
    return _storage(self, "is_coalesced").coalesced


def _values(self):
    """The stored values, sharing memory, outside the graph (PyTorch's ``_values``)."""
    return wrap(_storage(self, "_values").values)


def _indices(self):
    return wrap(_storage(self, "_indices").indices)


def _require_coalesced(self, what):
    data = _storage(self, what)
    if not data.coalesced:
        raise RuntimeError(f"Cannot get {what} on an uncoalesced tensor, please call .coalesce() "
                           "first")
    return data


def _values_grad_vjp(xp, g, m):
    _first_order(xp, "values")
    return COO(m["indices"], _to_dense_array(g), m["shape"], True)


ValuesBackward0 = defop("ValuesBackward0", vjps=(_values_grad_vjp,))


def values(self):
    data = _require_coalesced(self, "values")
    return record(ValuesBackward0, data.values, (self,), (),
                  {"indices": data.indices, "shape": data.shape})


def indices(self):
    return wrap(_require_coalesced(self, "indices").indices)


def _nnz(self):
    return _storage(self, "_nnz").nnz


def sparse_dim(self):
    return array_of(self).sparse_dim if is_sparse(self) else 0


def dense_dim(self):
    return array_of(self).dense_dim if is_sparse(self) else array_of(self).ndim


# ---------------------------------------------------------------------- torch.sparse.sum
def _full_sum_vjp(xp, g, m, x):
    """A sparse gradient on the input's entries, each the gradient of the sum."""
    _first_order(xp, "torch.sparse.sum")
    entries = x.coalesce()
    vals = np.broadcast_to(np.asarray(g, dtype=entries.dtype), entries.values.shape).copy()
    return COO(entries.indices, vals, entries.shape, True)


SumBackward0 = defop("SumBackward0", saved=("self",), vjps=(_full_sum_vjp,))


def _partial_sum_vjp(xp, g, m, x):
    """Each input entry takes the gradient at the position it was summed into."""
    _first_order(xp, "torch.sparse.sum")
    entries = x.coalesce()
    kept, dense_summed = m["kept"], m["dense_summed"]
    projected = entries.indices[kept]
    if isinstance(g, COO):
        vals = _gather(g, projected) if kept else np.broadcast_to(
            g.to_dense(), (entries.nnz,) + g.shape)
    else:
        vals = g[tuple(projected)] if kept else np.broadcast_to(g, (entries.nnz,) + g.shape)
    for axis in dense_summed:  # dense dimensions summed over: broadcast back
        vals = np.expand_dims(vals, axis)
    vals = np.broadcast_to(vals, entries.values.shape).astype(entries.dtype, copy=True)
    return COO(entries.indices, vals, entries.shape, True)


SparseSumBackward0 = defop("SparseSumBackward0", saved=("self",), vjps=(_partial_sum_vjp,))


def sum(input, dim=None, dtype=None):  # noqa: A001 - torch.sparse.sum
    """Sum of a sparse tensor: over everything (a dense 0-d tensor), or over ``dim``
    (sparse while sparse dimensions remain), as ``torch.sparse.sum``."""
    data = _storage(input, "torch.sparse.sum")
    if dtype is not None:
        input = input.to(dtype)
        data = array_of(input)
    if dim is None:
        return record(SumBackward0, np.asarray(data.values.sum()), (input,), (input,))
    dims = sorted({d % data.ndim for d in ((dim,) if isinstance(dim, int) else dim)})
    entries = data.coalesce()
    sparse_dim = entries.sparse_dim
    kept = [d for d in range(sparse_dim) if d not in dims]
    dense_summed = tuple(d - sparse_dim + 1 for d in dims if d >= sparse_dim)
    vals = entries.values.sum(axis=dense_summed) if dense_summed else entries.values
    shape = tuple(s for d, s in enumerate(data.shape) if d not in dims)
    meta = {"kept": kept, "dense_summed": dense_summed}
    if not kept:  # every sparse dimension summed: a dense result
        out = np.asarray(vals.sum(axis=0))
    else:
        out = COO(entries.indices[kept], vals, shape, False).coalesce()
    return record(SparseSumBackward0, out, (input,), (input,), meta)


# ---------------------------------------------------------------------- torch.sparse.mm
def _sparse_mm_vjp_sparse(xp, g, m, a, b):
    """The gradient of ``a`` on its own entries only: row i of g dot row j of b."""
    _first_order(xp, "torch.sparse.mm")
    entries = a.coalesce()
    rows, cols = entries.indices
    vals = np.einsum("nk,nk->n", np.asarray(g)[rows], np.conj(b[cols]))
    return COO(entries.indices, vals.astype(entries.dtype, copy=False), entries.shape, True)


def _sparse_mm_vjp_dense(xp, g, m, a, b):
    _first_order(xp, "torch.sparse.mm")
    return np.matmul(a.conj().T, g)


SparseAddmmBackward0 = defop("SparseAddmmBackward0", saved=("mat1", "mat2"),
                             vjps=(_sparse_mm_vjp_sparse, _sparse_mm_vjp_dense))


def mm(mat1, mat2):
    """``mat1 @ mat2`` for a sparse ``mat1`` and a dense ``mat2`` (dense result); the
    gradient of ``mat1`` is sparse, on its own entries (``torch.sparse.mm``)."""
    if not is_sparse(mat1) or is_sparse(mat2):
        if not is_sparse(mat1) and not is_sparse(mat2):
            from ..ops.linalg import mm as dense_mm
            return dense_mm(mat1, mat2)
        raise unsupported("torch.sparse.mm of these layouts (sparse @ dense is supported)")
    a, b = array_of(mat1), array_of(mat2)
    if a.ndim != 2 or b.ndim != 2:
        raise RuntimeError(f"torch.sparse.mm: expected 2-D matrices, got {a.ndim}-D and "
                           f"{b.ndim}-D")
    if a.dtype != b.dtype:
        raise RuntimeError(f"mat1 and mat2 must have the same dtype, but got {mat1.dtype} and "
                           f"{mat2.dtype}")
    return record(SparseAddmmBackward0, np.matmul(a, b), (mat1, mat2), (mat1, mat2))


# ---------------------------------------------------------------------- Tensor methods
def _layout(self):
    return sparse_coo if is_sparse(self) else strided


class SparseMethods:
    """A Tensor's sparse layout: ``is_sparse``, ``layout`` and the methods of sparse COO
    tensors (a base of ``distgrad.Tensor``)."""

    __slots__ = ()
    is_sparse = property(is_sparse)  # the module's function, as a property
    layout = property(_layout)
    to_sparse = to_sparse_coo = to_sparse
    to_dense, coalesce, is_coalesced = to_dense, coalesce, is_coalesced
    _values, _indices, values, indices = _values, _indices, values, indices
    _nnz, sparse_dim, dense_dim = _nnz, sparse_dim, dense_dim

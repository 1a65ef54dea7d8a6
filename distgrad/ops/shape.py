"""Shape ops: views (reshape, view, transpose, permute, squeeze, unsqueeze, expand, ...) and
joins/splits (cat, stack, split, chunk, unbind).

View ops share the input's storage and version counter, as in PyTorch.
"""
import numpy as np

from ..autograd.tensor import TensorBase
from ..autograd._internal import (array_of, wrap_dim, defop, record, record_view,
                                  record_multi)
from .promotion import result_dtype

__all__ = ["reshape", "view", "view_as", "transpose", "swapaxes", "swapdims", "permute", "t",
           "squeeze", "unsqueeze", "expand", "expand_as", "broadcast_to", "flatten", "unflatten",
           "cat", "concat", "concatenate", "stack", "split", "chunk", "unbind", "clone",
           "contiguous", "flip", "movedim", "narrow", "repeat", "tile", "hstack", "vstack",
           "numel", "reshape_as"]


def _shape_arg(shape):
    if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
        shape = tuple(shape[0])
    return tuple(int(s) for s in shape)


def _infer(shape, numel):
    shape = list(shape)
    neg = [i for i, s in enumerate(shape) if s == -1]
    if len(neg) > 1:
        raise RuntimeError("only one dimension can be inferred")
    known = 1
    for s in shape:
        if s != -1:
            if s < 0:
                raise RuntimeError(f"invalid shape dimension {s}")
            known *= s
    if neg:
        if known == 0 or numel % known:
            raise RuntimeError(f"shape '{list(shape)}' is invalid for input of size {numel}")
        shape[neg[0]] = numel // known
    elif known != numel:
        raise RuntimeError(f"shape '{list(shape)}' is invalid for input of size {numel}")
    return tuple(shape)


_reshape_vjp = (lambda xp, g, m: xp.reshape(g, m["self_sym_sizes"]),)
ViewBackward0 = defop("ViewBackward0", vjps=_reshape_vjp)
UnsafeViewBackward0 = defop("UnsafeViewBackward0", vjps=_reshape_vjp)
SqueezeBackward0 = defop("SqueezeBackward0", vjps=_reshape_vjp)
SqueezeBackward1 = defop("SqueezeBackward1", vjps=_reshape_vjp)
UnsqueezeBackward0 = defop("UnsqueezeBackward0", vjps=_reshape_vjp)
TransposeBackward0 = defop("TransposeBackward0", vjps=(
    lambda xp, g, m: xp.swapaxes(g, m["dim0"], m["dim1"]),))
TBackward0 = defop("TBackward0", vjps=(lambda xp, g, m: xp.swapaxes(g, 0, -1) if g.ndim == 2 else g,))
PermuteBackward0 = defop("PermuteBackward0", vjps=(
    lambda xp, g, m: xp.transpose(g, tuple(np.argsort(m["dims"]))),))
# The engine sums a broadcast gradient down to the input's shape.
ExpandBackward0 = defop("ExpandBackward0", vjps=(lambda xp, g, m: g,))
CloneBackward0 = defop("CloneBackward0", vjps=(lambda xp, g, m: g,))
FlipBackward0 = defop("FlipBackward0", vjps=(lambda xp, g, m: xp.flip(g, m["dims"]),))


def _view_of(node, input, out, meta, view_fn):
    return record_view(node, out, input, meta, view_fn)


def view(input, *shape):
    if len(shape) == 1 and not isinstance(shape[0], (tuple, list, int)):
        raise TypeError("view(dtype) is not supported; use .to(dtype)")
    d = array_of(input)
    new_shape = _infer(_shape_arg(shape), d.size)
    out = d.view()
    try:
        out.shape = new_shape
    except AttributeError:
        raise RuntimeError("view size is not compatible with input tensor's size and stride (at "
                           "least one dimension spans across two contiguous subspaces). Use "
                           ".reshape(...) instead.") from None
    return _view_of(ViewBackward0, input, out, {"self_sym_sizes": d.shape},
                    lambda a, s=new_shape: a.reshape(s))


def reshape(input, *shape):
    d = array_of(input)
    new_shape = _infer(_shape_arg(shape), d.size)
    out = d.reshape(new_shape)
    meta = {"self_sym_sizes": d.shape}
    if np.shares_memory(out, d) if out.size else True:
        return _view_of(ViewBackward0, input, out, meta, lambda a, s=new_shape: a.reshape(s))
    return record(UnsafeViewBackward0, out, (input,), (), meta)


def view_as(input, other):
    return view(input, other.shape)


def reshape_as(input, other):
    return reshape(input, other.shape)


def flatten(input, start_dim=0, end_dim=-1):
    d = array_of(input)
    if d.ndim == 0:
        return reshape(input, 1)
    s, e = wrap_dim(start_dim, d.ndim), wrap_dim(end_dim, d.ndim)
    if s > e:
        raise RuntimeError("flatten() has invalid args: start_dim cannot come after end_dim")
    if s == e:
        return input
    n = 1
    for k in d.shape[s:e + 1]:
        n *= k
    return reshape(input, d.shape[:s] + (n,) + d.shape[e + 1:])


def unflatten(input, dim, sizes):
    d = array_of(input)
    dim = wrap_dim(dim, d.ndim)
    provided, sizes = list(sizes), list(sizes)
    if -1 in sizes:
        known = int(np.prod([s for s in sizes if s != -1]))
        sizes[sizes.index(-1)] = d.shape[dim] // known if known else 0
    if int(np.prod(sizes)) != d.shape[dim]:
        raise RuntimeError(f"unflatten: Provided sizes {provided} don't multiply up to the "
                           f"size of dim {dim} ({d.shape[dim]}) in the input tensor")
    return reshape(input, d.shape[:dim] + tuple(sizes) + d.shape[dim + 1:])


def transpose(input, dim0, dim1):
    d = array_of(input)
    d0, d1 = wrap_dim(dim0, d.ndim), wrap_dim(dim1, d.ndim)
    out = np.swapaxes(d, d0, d1)
    return _view_of(TransposeBackward0, input, out, {"dim0": d0, "dim1": d1},
                    lambda a, i=d0, j=d1: np.swapaxes(a, i, j))


swapaxes = transpose
swapdims = transpose


def t(input):
    d = array_of(input)
    if d.ndim > 2:
        raise RuntimeError(f"t() expects a tensor with <= 2 dimensions, but self is {d.ndim}D")
    return _view_of(TBackward0, input, d.T, None, lambda a: a.T)


def permute(input, *dims):
    d = array_of(input)
    dims = _shape_arg(dims)
    if len(dims) != d.ndim:
        raise RuntimeError(f"permute(sparse_coo): number of dimensions in the tensor input does "
                           f"not match the length of the desired ordering of dimensions i.e. "
                           f"input.dim() = {d.ndim} is not equal to len(dims) = {len(dims)}")
    dims = tuple(wrap_dim(x, d.ndim) for x in dims)
    if len(set(dims)) != len(dims):
        raise RuntimeError("permute(): duplicate dims are not allowed.")
    return _view_of(PermuteBackward0, input, np.transpose(d, dims), {"dims": dims},
                    lambda a, p=dims: np.transpose(a, p))


def movedim(input, source, destination):
    d = array_of(input)
    src = [source] if isinstance(source, int) else list(source)
    dst = [destination] if isinstance(destination, int) else list(destination)
    src = [wrap_dim(s, d.ndim) for s in src]
    dst = [wrap_dim(s, d.ndim) for s in dst]
    order = [i for i in range(d.ndim) if i not in src]
    for to, frm in sorted(zip(dst, src)):
        order.insert(to, frm)
    return permute(input, *[int(i) for i in order])


def squeeze(input, dim=None):
    d = array_of(input)
    if dim is None:
        out = d.reshape(tuple(s for s in d.shape if s != 1))
    else:
        dims = dim if isinstance(dim, (tuple, list)) else (dim,)
        dims = {wrap_dim(x, d.ndim) for x in dims} if d.ndim else set()
        out = d.reshape(tuple(s for i, s in enumerate(d.shape) if not (i in dims and s == 1)))
    shape = out.shape
    node = SqueezeBackward0 if dim is None else SqueezeBackward1
    return _view_of(node, input, out, {"self_sym_sizes": d.shape},
                    lambda a, s=shape: a.reshape(s))


def unsqueeze(input, dim):
    d = array_of(input)
    dim = wrap_dim(dim, d.ndim + 1)
    out = np.expand_dims(d, dim)
    return _view_of(UnsqueezeBackward0, input, out, {"self_sym_sizes": d.shape, "dim": dim},
                    lambda a, k=dim: np.expand_dims(a, k))


def expand(input, *sizes):
    d = array_of(input)
    sizes = _shape_arg(sizes)
    if len(sizes) < d.ndim:
        raise RuntimeError(f"expand(...): the number of sizes provided ({len(sizes)}) must be "
                           f"greater or equal to the number of dimensions in the tensor ({d.ndim})")
    lead = len(sizes) - d.ndim
    target = tuple(d.shape[i - lead] if (s == -1 and i >= lead) else s for i, s in enumerate(sizes))
    try:
        out = np.broadcast_to(d, target)
    except ValueError:
        raise RuntimeError(f"The expanded size of the tensor must match the existing size at "
                           f"non-singleton dimensions. Target sizes: {list(sizes)}. Tensor "
                           f"sizes: {list(d.shape)}") from None
    return _view_of(ExpandBackward0, input, out, {"self_sym_sizes": d.shape},
                    lambda a, s=target: np.broadcast_to(a, s))


def expand_as(input, other):
    return expand(input, other.shape)


def broadcast_to(input, size):
    return expand(input, size)



def clone(input, *, memory_format=None):
    return record(CloneBackward0, array_of(input).copy(), (input,))


def contiguous(input, memory_format=None):
    if array_of(input).flags.c_contiguous:
        return input
    return record(CloneBackward0, np.ascontiguousarray(array_of(input)), (input,))


def flip(input, dims):
    d = array_of(input)
    dims = (dims,) if isinstance(dims, int) else tuple(dims)
    dims = tuple(wrap_dim(x, d.ndim) for x in dims)
    return record(FlipBackward0, np.flip(d, dims).copy(), (input,), (), {"dims": dims})


def _cat_vjp(xp, grads, m, needs):
    g = grads[0]
    pieces = xp.split_at(g, m["offsets"], m["dim"])
    return tuple(p if need else None for p, need in zip(pieces, needs))


def _stack_vjp(xp, grads, m, needs):
    g = grads[0]
    pieces = xp.split_at(g, m["offsets"], m["dim"])
    return tuple(xp.squeeze(p, m["dim"]) if need else None for p, need in zip(pieces, needs))


CatBackward0 = defop("CatBackward0", vjp_all=_cat_vjp)
StackBackward0 = defop("StackBackward0", vjp_all=_stack_vjp)


def _as_list(tensors, name):
    if isinstance(tensors, TensorBase):
        raise TypeError(f"{name}(): argument 'tensors' must be a tuple of Tensors, not Tensor")
    tensors = list(tensors)
    if not tensors:
        raise RuntimeError(f"{name}(): expected a non-empty list of Tensors")
    return tensors


def cat(tensors, dim=0):
    tensors = _as_list(tensors, "cat")
    # PyTorch skips legacy empty 1-D tensors in cat.
    arrays = [array_of(t) for t in tensors]
    ref = next((a for a in arrays if not (a.ndim == 1 and a.size == 0)), arrays[0])
    dim = wrap_dim(dim, ref.ndim)
    dt = arrays[0].dtype
    for a in arrays[1:]:
        if a.dtype != dt:
            dt = result_dtype(np.empty((1,), dt), np.empty((1,), a.dtype))
    keep = [i for i, a in enumerate(arrays) if not (a.ndim == 1 and a.size == 0 and ref.ndim != 1)]
    for i in keep:
        a = arrays[i]
        if a.ndim != ref.ndim or any(a.shape[k] != ref.shape[k] for k in range(ref.ndim) if k != dim):
            raise RuntimeError(f"Sizes of tensors must match except in dimension {dim}. Expected "
                               f"size {ref.shape[1 if dim == 0 else 0] if ref.ndim > 1 else ref.shape[0]} "
                               f"but got size {list(a.shape)} for tensor number {i} in the list.")
    out = np.concatenate([arrays[i].astype(dt, copy=False) for i in keep], axis=dim)
    sizes = [arrays[i].shape[dim] for i in keep]
    offsets = list(np.cumsum(sizes)[:-1])
    used = [tensors[i] for i in keep]
    return record(CatBackward0, out, tuple(used), (), {"dim": dim, "offsets": offsets})


concat = cat
concatenate = cat


def stack(tensors, dim=0):
    tensors = _as_list(tensors, "stack")
    shape = array_of(tensors[0]).shape
    for i, t_ in enumerate(tensors):
        if array_of(t_).shape != shape:
            raise RuntimeError(f"stack expects each tensor to be equal size, but got "
                               f"{list(shape)} at entry 0 and {list(array_of(t_).shape)} at entry {i}")
    dim = wrap_dim(dim, len(shape) + 1)
    out = np.stack([array_of(t_) for t_ in tensors], axis=dim)
    return record(StackBackward0, out, tuple(tensors), (),
                  {"dim": dim, "offsets": list(range(1, len(tensors)))})


def hstack(tensors):
    tensors = list(tensors)
    return cat(tensors, 0 if tensors[0].ndim == 1 else 1)


def vstack(tensors):
    return cat([t_ if t_.ndim >= 2 else t_.reshape(1, -1) for t_ in tensors], 0)


def _split_vjp(xp, grads, m, needs):
    """Join the pieces' gradients, with zeros for pieces that got none."""
    like = next((g for g in grads if g is not None), None)
    if like is None:
        return (None,)
    pieces = [g if g is not None else xp.zeros(shape, like) for g, shape in zip(grads, m["shapes"])]
    return (xp.concatenate(pieces, m["dim"]),)


SplitBackward0 = defop("SplitBackward0", vjp_all=_split_vjp)
SplitWithSizesBackward0 = defop("SplitWithSizesBackward0", vjp_all=_split_vjp)


def _unbind_vjp(xp, grads, m, needs):
    shapes = m["shapes"]
    like = next(g for g in grads if g is not None)
    pieces = [xp.expand_dims(g if g is not None else xp.zeros(shape, like), m["dim"])
              for g, shape in zip(grads, shapes)]
    return (xp.concatenate(pieces, m["dim"]),)


UnbindBackward0 = defop("UnbindBackward0", vjp_all=_unbind_vjp)


def split(tensor, split_size_or_sections, dim=0):
    d = array_of(tensor)
    dim = wrap_dim(dim, d.ndim)
    n = d.shape[dim]
    if isinstance(split_size_or_sections, int):
        size = split_size_or_sections
        if size <= 0:
            raise RuntimeError(f"split expects split_size be non-negative, but got split_size={size}")
        sizes = [min(size, n - i) for i in range(0, n, size)] or [0]
        node = SplitBackward0
    else:
        sizes = list(split_size_or_sections)
        if sum(sizes) != n:
            raise RuntimeError(f"split_with_sizes expects split_sizes to sum exactly to {n} (input "
                               f"tensor's size at dimension {dim}), but got split_sizes={sizes}")
        node = SplitWithSizesBackward0
    offsets = np.cumsum(sizes)[:-1]
    parts = np.split(d, offsets, axis=dim)
    return tuple(record_multi(node, parts, (tensor,), (),
                              {"dim": dim, "shapes": [p.shape for p in parts]}, views_of=tensor))


def chunk(input, chunks, dim=0):
    if chunks <= 0:
        raise RuntimeError("chunk expects `chunks` to be greater than 0")
    n = array_of(input).shape[wrap_dim(dim, array_of(input).ndim)]
    size = -(-n // chunks) if n else 1
    return split(input, size, dim)


def unbind(input, dim=0):
    d = array_of(input)
    dim = wrap_dim(dim, d.ndim)
    parts = [d[(slice(None),) * dim + (i,)] for i in range(d.shape[dim])]
    return tuple(record_multi(UnbindBackward0, parts, (input,), (),
                              {"dim": dim, "shapes": [p.shape for p in parts]}, views_of=input))


def narrow(input, dim, start, length):
    d = array_of(input)
    dim = wrap_dim(dim, d.ndim)
    key = (slice(None),) * dim + (slice(start, start + length),)
    return input[key]


def repeat(input, *sizes):
    sizes = _shape_arg(sizes)
    d = array_of(input)
    if len(sizes) < d.ndim:
        raise RuntimeError("Number of dimensions of repeat dims can not be smaller than number of "
                           "dimensions of tensor")
    x = input.reshape((1,) * (len(sizes) - d.ndim) + d.shape)
    # repeat == expand over interleaved singleton axes, then reshape: gradients come for free.
    shape = array_of(x).shape
    inter = []
    target = []
    for s, r in zip(shape, sizes):
        inter += [1, s]
        target += [r, s]
    out = x.reshape(inter).expand(target)
    return reshape(contiguous(out), tuple(s * r for s, r in zip(shape, sizes)))


def tile(input, dims):
    dims = tuple(dims)
    d = array_of(input)
    if len(dims) < d.ndim:
        dims = (1,) * (d.ndim - len(dims)) + dims
    return repeat(input, dims)


def numel(input):
    return input.numel()

"""Collectives on tensors, with ``torch.distributed``'s signatures.

Each function checks its arguments and builds the collective's fingerprint
(``collective_call.py``) and its program (``algorithms.py``), and hands both to
the world's communicator. With ``async_op=True`` it returns the
:class:`~distgrad.distributed.work.Work`; otherwise it waits. Results are
written into the given tensors in place (also non-contiguous ones and views),
and their version counters move, as for any in-place op.

Point-to-point sends and receives are in ``point_to_point.py``, the ``*_object``
collectives in ``object_collectives.py``.
"""
import numpy as np

from ..autograd._internal import array_of
from . import algorithms as alg
from .collective_call import (_Out, _check_root, _done, _dtype_name, _flat, _fp, _group, _root,
                              _run, _same_list, _tensor, _tensors)
from .reduce_op import ReduceOp, check_op, op_name

__all__ = ["all_reduce", "broadcast", "reduce", "all_gather", "all_gather_into_tensor",
           "reduce_scatter", "reduce_scatter_tensor", "gather", "scatter", "all_to_all",
           "all_to_all_single", "barrier", "monitored_barrier"]


def all_reduce(tensor, op=ReduceOp.SUM, group=None, async_op=False):
    """Reduce ``tensor`` across the group, in place on every rank."""
    _tensor(tensor, "tensor")
    g = _group(group, "all_reduce")
    if g is None:
        return None
    op = check_op(op, array_of(tensor).dtype, "all_reduce")
    out = _Out(tensor, "all_reduce")
    return _run(g, _fp("all_reduce", [tensor], op=op_name(op)),
                alg.all_reduce(out.flat, op, g.size()), [tensor], out.done, async_op)


def broadcast(tensor, src=None, group=None, async_op=False, group_src=None):
    """``tensor`` of rank ``src`` into ``tensor`` of every rank."""
    _tensor(tensor, "tensor")
    g = _group(group, "broadcast")
    if g is None:
        return None
    root = _root(g, src, group_src, "src", "broadcast")
    out = _Out(tensor, "broadcast")
    return _run(g, _fp("broadcast", [tensor], src=root), alg.broadcast(out.flat, root, g.size()),
                [tensor], out.done, async_op)


def reduce(tensor, dst=None, op=ReduceOp.SUM, group=None, async_op=False, group_dst=None):
    """Reduce ``tensor`` of every rank into ``tensor`` of rank ``dst``."""
    _tensor(tensor, "tensor")
    g = _group(group, "reduce")
    if g is None:
        return None
    root = _root(g, dst, group_dst, "dst", "reduce")
    op = check_op(op, array_of(tensor).dtype, "reduce")
    out = _Out(tensor, "reduce")
    return _run(g, _fp("reduce", [tensor], dst=root, op=op_name(op)),
                alg.reduce(out.flat, op, root, g.size()), [tensor], out.done, async_op)


def _gather_into(g, collective, inp, outs, async_op, result):
    """All-gather ``inp`` of every rank into ``outs`` (one flat array per rank, in order)."""
    n = g.size()
    block = array_of(inp).size
    work = np.empty(n * block, dtype=array_of(inp).dtype)
    work[g.rank() * block:(g.rank() + 1) * block] = _flat(inp)

    def finish():
        for i, o in enumerate(outs):
            o.flat[...] = work[i * block:(i + 1) * block]
            o.done()
    return _run(g, _fp(collective, [inp]), alg.all_gather(work, block, n), result, finish,
                async_op)


def all_gather(tensor_list, tensor, group=None, async_op=False):
    """``tensor_list[i]`` = ``tensor`` of rank ``i``, on every rank."""
    _tensors(tensor_list, "tensor_list")
    _tensor(tensor, "tensor")
    g = _group(group, "all_gather")
    if g is None:
        return None
    _same_list(tensor_list, tensor, g.size(), "all_gather", "tensor_list")
    outs = [_Out(t, "all_gather") for t in tensor_list]
    return _gather_into(g, "all_gather", tensor, outs, async_op, list(tensor_list))


def all_gather_into_tensor(output_tensor, input_tensor, group=None, async_op=False):
    """Every rank's ``input_tensor``, concatenated (or stacked) in rank order, into
    ``output_tensor`` on every rank."""
    _tensor(output_tensor, "output_tensor")
    _tensor(input_tensor, "input_tensor")
    g = _group(group, "all_gather_into_tensor")
    if g is None:
        return None
    n = g.size()
    if array_of(output_tensor).size != n * array_of(input_tensor).size:
        raise RuntimeError(f"all_gather_into_tensor: output tensor of {array_of(output_tensor).size} "
                           f"elements must hold {n} x {array_of(input_tensor).size} (world size x "
                           "input elements)")
    if array_of(output_tensor).dtype != array_of(input_tensor).dtype:
        raise RuntimeError(f"all_gather_into_tensor: output dtype {_dtype_name(output_tensor)} "
                           f"differs from input dtype {_dtype_name(input_tensor)}")
    out = _Out(output_tensor, "all_gather_into_tensor")
    block = array_of(input_tensor).size
    r = g.rank()
    out.flat[r * block:(r + 1) * block] = _flat(input_tensor)
    return _run(g, _fp("all_gather_into_tensor", [input_tensor]),
                alg.all_gather(out.flat, block, n), [output_tensor], out.done, async_op)


def _reduce_scatter(g, collective, output, work, op, async_op):
    op = check_op(op, array_of(output).dtype, collective)
    out = _Out(output, collective)
    return _run(g, _fp(collective, [output], op=op_name(op)),
                alg.reduce_scatter(work, array_of(output).size, op, out.flat, g.size()), [output],
                out.done, async_op)


def reduce_scatter(output, input_list, op=ReduceOp.SUM, group=None, async_op=False):
    """``output`` on rank ``r`` = the reduction of ``input_list[r]`` over all ranks."""
    _tensor(output, "output")
    _tensors(input_list, "input_list")
    g = _group(group, "reduce_scatter")
    if g is None:
        return None
    _same_list(input_list, output, g.size(), "reduce_scatter", "input_list")
    work = np.concatenate([_flat(t) for t in input_list]) if input_list else \
        np.empty(0, array_of(output).dtype)
    return _reduce_scatter(g, "reduce_scatter", output, work, op, async_op)


def reduce_scatter_tensor(output, input, op=ReduceOp.SUM, group=None, async_op=False):
    """``input`` is ``world size`` blocks; ``output`` on rank ``r`` = block ``r`` reduced."""
    _tensor(output, "output")
    _tensor(input, "input")
    g = _group(group, "reduce_scatter_tensor")
    if g is None:
        return None
    if array_of(input).size != g.size() * array_of(output).size:
        raise RuntimeError(f"reduce_scatter_tensor: input tensor of {array_of(input).size} elements "
                           f"must hold {g.size()} x {array_of(output).size} (world size x output "
                           "elements)")
    if array_of(input).dtype != array_of(output).dtype:
        raise RuntimeError(f"reduce_scatter_tensor: input dtype {_dtype_name(input)} differs "
                           f"from output dtype {_dtype_name(output)}")
    return _reduce_scatter(g, "reduce_scatter_tensor", output, np.array(_flat(input)), op,
                           async_op)


def gather(tensor, gather_list=None, dst=None, group=None, async_op=False, group_dst=None):
    """``gather_list[i]`` on rank ``dst`` = ``tensor`` of rank ``i``."""
    _tensor(tensor, "tensor")
    g = _group(group, "gather")
    if g is None:
        return None
    root = _root(g, dst, group_dst, "dst", "gather", checked=False)
    if g.rank() == root:
        _same_list(_tensors(gather_list, "gather_list"), tensor, g.size(), "gather",
                   "gather_list", ValueError)
        outs = [_Out(t, "gather") for t in gather_list]
    elif gather_list:
        raise ValueError("Argument ``gather_list`` must NOT be specified on non-destination "
                         "ranks.")
    else:
        outs = None
    _check_root(g, root, "gather")
    got = [None] * g.size() if outs is not None else None

    def finish():
        for o, x in zip(outs or (), got or ()):
            o.flat[...] = x
            o.done()
    return _run(g, _fp("gather", [tensor], dst=root), alg.gather(_flat(tensor), got, root),
                list(gather_list or []), finish, async_op)


def scatter(tensor, scatter_list=None, src=None, group=None, async_op=False, group_src=None):
    """``tensor`` on rank ``i`` = ``scatter_list[i]`` of rank ``src``."""
    _tensor(tensor, "tensor")
    g = _group(group, "scatter")
    if g is None:
        return None
    root = _root(g, src, group_src, "src", "scatter", checked=False)
    ins = None
    if g.rank() == root:
        _same_list(_tensors(scatter_list, "scatter_list"), tensor, g.size(), "scatter",
                   "scatter_list", ValueError)
        ins = [_flat(t) for t in scatter_list]
    elif scatter_list:
        raise ValueError("Argument ``scatter_list`` must NOT be specified on non-source ranks.")
    _check_root(g, root, "scatter")
    out = _Out(tensor, "scatter")

    def deliver(x):
        if type(x) is not np.ndarray or x.shape != out.flat.shape or x.dtype != out.flat.dtype:
            raise RuntimeError(f"scatter: rank {root} sent {_describe(x)}, this rank's tensor is "
                               f"{list(array_of(tensor).shape)} {_dtype_name(tensor)}")
        out.flat[...] = x
    return _run(g, _fp("scatter", [tensor], src=root), alg.scatter(ins, root, deliver),
                [tensor], out.done, async_op)


def _describe(x):
    if type(x) is np.ndarray:
        return f"a tensor of {x.size} {x.dtype} elements"
    return f"a {type(x).__name__}"


def all_to_all(output_tensor_list, input_tensor_list, group=None, async_op=False):
    """``output_tensor_list[i]`` on rank ``r`` = ``input_tensor_list[r]`` of rank ``i``."""
    _tensors(output_tensor_list, "output_tensor_list")
    _tensors(input_tensor_list, "input_tensor_list")
    g = _group(group, "all_to_all")
    if g is None:
        return None
    n = g.size()
    for what, ts in (("output_tensor_list", output_tensor_list),
                     ("input_tensor_list", input_tensor_list)):
        if len(ts) != n:
            raise RuntimeError(f"all_to_all: {what} must have {n} tensors, not {len(ts)}")
    dtypes = {array_of(t).dtype for t in list(output_tensor_list) + list(input_tensor_list)}
    if len(dtypes) > 1:
        raise RuntimeError(f"all_to_all: tensors must all have one dtype, not "
                           f"{sorted(d.name for d in dtypes)}")
    outs = [_Out(t, "all_to_all") for t in output_tensor_list]
    return _all_to_all(g, "all_to_all", [_flat(t) for t in input_tensor_list], outs,
                       [o.flat for o in outs], output_tensor_list[0], async_op,
                       list(output_tensor_list))


def _all_to_all(g, collective, ins, outs, slots, ref, async_op, result):
    def deliver(p, x):
        slot = slots[p]
        if type(x) is not np.ndarray or x.shape != slot.shape or x.dtype != slot.dtype:
            raise RuntimeError(f"{collective}: rank {p} sent {_describe(x)}, where this rank "
                               f"expects {slot.size} {slot.dtype} elements")
        slot[...] = x
    return _run(g, _fp(collective, [], dtype=_dtype_name(ref)), alg.all_to_all(ins, deliver),
                result, _done(*outs), async_op)


def _splits(sizes, total, n, what):
    if sizes is None or len(sizes) == 0:
        if total % n:
            raise RuntimeError(f"all_to_all_single: {what} dim 0 of size {total} does not "
                               f"split evenly among {n} ranks; pass {what}_split_sizes")
        return [total // n] * n
    sizes = [int(s) for s in sizes]
    if len(sizes) != n or sum(sizes) != total or min(sizes) < 0:
        raise RuntimeError(f"all_to_all_single: {what}_split_sizes {sizes} must be {n} "
                           f"non-negative sizes adding up to {total}")
    return sizes


def all_to_all_single(output, input, output_split_sizes=None, input_split_sizes=None,
                      group=None, async_op=False):
    """Split ``input`` along dim 0, send piece ``i`` to rank ``i``; ``output`` gets the
    pieces from every rank, in rank order."""
    _tensor(output, "output")
    _tensor(input, "input")
    g = _group(group, "all_to_all_single")
    if g is None:
        return None
    n = g.size()
    if array_of(input).dtype != array_of(output).dtype:
        raise RuntimeError(f"all_to_all_single: input dtype {_dtype_name(input)} differs from "
                           f"output dtype {_dtype_name(output)}")
    a_in, a_out = array_of(input), array_of(output)
    if a_in.ndim == 0 or a_out.ndim == 0 or a_in.shape[1:] != a_out.shape[1:]:
        raise RuntimeError(f"all_to_all_single: input {list(a_in.shape)} and output "
                           f"{list(a_out.shape)} must agree beyond dim 0")
    row = int(np.prod(a_in.shape[1:], dtype=np.int64))
    s_in = np.cumsum([0] + _splits(input_split_sizes, a_in.shape[0], n, "input")) * row
    s_out = np.cumsum([0] + _splits(output_split_sizes, a_out.shape[0], n, "output")) * row
    flat_in = _flat(input)
    out = _Out(output, "all_to_all_single")
    ins = [flat_in[s_in[i]:s_in[i + 1]] for i in range(n)]
    slots = [out.flat[s_out[i]:s_out[i + 1]] for i in range(n)]
    return _all_to_all(g, "all_to_all_single", ins, [out], slots, output, async_op, [output])


def barrier(group=None, async_op=False, device_ids=None, timeout=None):
    """Wait until every rank of the group called it."""
    g = _group(group, "barrier")
    if g is None:
        return None
    return _run(g, _fp("barrier"), alg.barrier(), [], None, async_op)


def monitored_barrier(group=None, timeout=None, wait_all_ranks=False):
    """A barrier: ranks that died, left or did not arrive within the group's timeout are
    named in the error (liveness is watched all the time, so this is ``barrier``)."""
    return barrier(group)

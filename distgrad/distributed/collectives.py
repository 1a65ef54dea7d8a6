"""Collectives on tensors and Python objects, with ``torch.distributed``'s signatures.

Each function checks its arguments (PyTorch's exception classes, messages that
name the argument), builds the collective's fingerprint (what must agree on
every rank: op, shapes, dtypes, root, reduction) and its program
(``algorithms.py``), and hands both to the world's communicator. With
``async_op=True`` it returns the :class:`~distgrad.distributed.work.Work`;
otherwise it waits. Results are written into the given tensors in place (also
non-contiguous ones and views), and their version counters move, as for any
in-place op.

Objects (the ``*_object`` collectives) travel through :mod:`distgrad.codec`,
never pickle: tensors, arrays, numbers, strings and containers.
"""
import numpy as np

from distgrad import codec
from distgrad.autograd.tensor import Tensor

from . import algorithms as alg
from .work import Work
from .process_group import (GroupMember, _warn_not_in_group, _world, get_group_rank,
                            resolve_group)
from .reduce_op import ReduceOp, check_op, op_name

__all__ = ["all_reduce", "broadcast", "reduce", "all_gather", "all_gather_into_tensor",
           "reduce_scatter", "reduce_scatter_tensor", "gather", "scatter", "all_to_all",
           "all_to_all_single", "barrier", "monitored_barrier", "send", "recv", "isend", "irecv",
           "P2POp", "batch_isend_irecv", "all_gather_object", "broadcast_object_list",
           "gather_object", "scatter_object_list", "send_object_list", "recv_object_list"]


# ---------------------------------------------------------------------- arguments
def _tensor(t, param):
    if not isinstance(t, Tensor):
        raise TypeError(f"Invalid function argument. Expected parameter `{param}` of type "
                        f"torch.Tensor\n             but got {type(t)} instead.")
    return t


def _tensors(ts, param):
    if not isinstance(ts, (list, tuple)) or not all(isinstance(t, Tensor) for t in ts):
        raise TypeError(f"Invalid function argument. Expected parameter `{param}` of type "
                        f"List[torch.Tensor]\n             but got {type(ts)} instead.")
    return list(ts)


def _dtype_name(t):
    return t._data.dtype.name


def _fp(name, tensors=(), **params):
    return [name, [list(t._data.shape) for t in tensors], [_dtype_name(t) for t in tensors],
            [[k, v] for k, v in params.items()]]


class _Out:
    """A tensor written by a collective: a flat contiguous array for the program (the
    tensor's own memory when it is contiguous), copied back at the end otherwise."""

    __slots__ = ("t", "flat", "copy_back")

    def __init__(self, t, collective):
        a = t._data
        if not a.flags.writeable:
            raise RuntimeError(f"{collective}: the output tensor of shape {list(a.shape)} is "
                               "read-only (a tensor received from a peer?); clone() it first")
        self.t = t
        self.copy_back = not a.flags.c_contiguous
        self.flat = (np.ascontiguousarray(a) if self.copy_back else a).reshape(-1)

    def done(self):
        if self.copy_back:
            np.copyto(self.t._data, self.flat.reshape(self.t._data.shape))
        self.t._vc[0] += 1


def _flat(t):
    return np.ascontiguousarray(t._data).reshape(-1)


def _same_list(ts, ref, n, collective, what, exc=RuntimeError):
    """``ts`` has ``n`` tensors shaped and typed like ``ref``."""
    if len(ts) != n:
        raise exc(f"{collective}: invalid {what} (expected {n} tensors, got {len(ts)})")
    for i, t in enumerate(ts):
        _same(t, ref, collective, what, i)


def _same(t, ref, collective, what, i):
    if t._data.shape != ref._data.shape:
        raise RuntimeError(f"{collective}: invalid tensor size at index {i} of {what} "
                           f"(expected {tuple(ref._data.shape)}, got {tuple(t._data.shape)})")
    if t._data.dtype != ref._data.dtype:
        raise RuntimeError(f"{collective}: invalid tensor type at index {i} of {what} "
                           f"(expected {_dtype_name(ref)}, got {_dtype_name(t)})")


def _group(group, collective):
    """The group to run in, or None (with PyTorch's warning) when this rank is not in it."""
    g = resolve_group(group)
    if g is GroupMember.NON_GROUP_MEMBER:
        _warn_not_in_group(collective)
        return None
    return g


def _root(g, global_rank, group_rank, param, collective, checked=True):
    """The group rank of a root given as a global rank or (``group_*``) a group rank; with
    ``checked=False`` its range is left to :func:`_check_root` (gather and scatter check
    their lists first, as PyTorch does)."""
    if group_rank is not None:
        if global_rank is not None:
            raise ValueError(f"Can't specify both {param} and group_{param}")
        r = group_rank
    elif global_rank is None:
        raise ValueError(f"{collective}: {param} (a global rank) or group_{param} must be given")
    elif g is _world.default_pg:
        r = global_rank
    else:
        r = get_group_rank(g, global_rank)
    return _check_root(g, r, collective) if checked else r


def _check_root(g, r, collective):
    if isinstance(r, bool) or not isinstance(r, int) or not 0 <= r < g.size():
        raise RuntimeError(f"{collective}: invalid root rank: {r} (the group has ranks "
                           f"0..{g.size() - 1})")
    return r


class _Alone:
    """The context of a program in a one-rank group: it never sends nor waits."""
    rank, size = 0, 1

    def send(self, peer, step, payload):
        raise RuntimeError("a one-rank collective has nobody to send to")

    def recv(self, peer, step):
        raise RuntimeError("a one-rank collective has nobody to receive from")


def _run(g, fp, planned, result=None, on_done=None, async_op=False):
    """Run collective ``fp`` (``planned``: (program, natural) from ``algorithms``) in ``g``."""
    program, natural = planned
    work = Work(result)
    if g._state is None:  # this rank alone: run the program here and now
        for _ in program(_Alone()):
            raise RuntimeError(f"{fp[0]}: a one-rank program waited for a message")
        if on_done is not None:
            on_done()
        work._finish()
    else:
        _world.comm.submit(g._state, fp, program, work, needs_left=not natural,
                           on_done=on_done)
    if async_op:
        return work
    work.wait()
    return None


def _done(*outs):
    def finish():
        for o in outs:
            o.done()
    return finish


# ---------------------------------------------------------------------- tensors
def all_reduce(tensor, op=ReduceOp.SUM, group=None, async_op=False):
    """Reduce ``tensor`` across the group, in place on every rank."""
    _tensor(tensor, "tensor")
    g = _group(group, "all_reduce")
    if g is None:
        return None
    op = check_op(op, tensor._data.dtype, "all_reduce")
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
    op = check_op(op, tensor._data.dtype, "reduce")
    out = _Out(tensor, "reduce")
    return _run(g, _fp("reduce", [tensor], dst=root, op=op_name(op)),
                alg.reduce(out.flat, op, root, g.size()), [tensor], out.done, async_op)


def _gather_into(g, collective, inp, outs, async_op, result):
    """All-gather ``inp`` of every rank into ``outs`` (one flat array per rank, in order)."""
    n = g.size()
    block = inp._data.size
    work = np.empty(n * block, dtype=inp._data.dtype)
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
    if output_tensor._data.size != n * input_tensor._data.size:
        raise RuntimeError(f"all_gather_into_tensor: output tensor of {output_tensor._data.size} "
                           f"elements must hold {n} x {input_tensor._data.size} (world size x "
                           "input elements)")
    if output_tensor._data.dtype != input_tensor._data.dtype:
        raise RuntimeError(f"all_gather_into_tensor: output dtype {_dtype_name(output_tensor)} "
                           f"differs from input dtype {_dtype_name(input_tensor)}")
    out = _Out(output_tensor, "all_gather_into_tensor")
    block = input_tensor._data.size
    r = g.rank()
    out.flat[r * block:(r + 1) * block] = _flat(input_tensor)
    return _run(g, _fp("all_gather_into_tensor", [input_tensor]),
                alg.all_gather(out.flat, block, n), [output_tensor], out.done, async_op)


def _reduce_scatter(g, collective, output, work, op, async_op):
    op = check_op(op, output._data.dtype, collective)
    out = _Out(output, collective)
    return _run(g, _fp(collective, [output], op=op_name(op)),
                alg.reduce_scatter(work, output._data.size, op, out.flat, g.size()), [output],
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
        np.empty(0, output._data.dtype)
    return _reduce_scatter(g, "reduce_scatter", output, work, op, async_op)


def reduce_scatter_tensor(output, input, op=ReduceOp.SUM, group=None, async_op=False):
    """``input`` is ``world size`` blocks; ``output`` on rank ``r`` = block ``r`` reduced."""
    _tensor(output, "output")
    _tensor(input, "input")
    g = _group(group, "reduce_scatter_tensor")
    if g is None:
        return None
    if input._data.size != g.size() * output._data.size:
        raise RuntimeError(f"reduce_scatter_tensor: input tensor of {input._data.size} elements "
                           f"must hold {g.size()} x {output._data.size} (world size x output "
                           "elements)")
    if input._data.dtype != output._data.dtype:
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
                               f"{list(tensor._data.shape)} {_dtype_name(tensor)}")
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
    dtypes = {t._data.dtype for t in list(output_tensor_list) + list(input_tensor_list)}
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
    if input._data.dtype != output._data.dtype:
        raise RuntimeError(f"all_to_all_single: input dtype {_dtype_name(input)} differs from "
                           f"output dtype {_dtype_name(output)}")
    a_in, a_out = input._data, output._data
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


# ---------------------------------------------------------------------- point to point
def _peer(g, peer, group_peer, param, collective):
    r = _root(g, peer, group_peer, param, collective)
    if r == g.rank():
        kind = "destination" if param == "dst" else "source"
        raise ValueError(f"Invalid {kind} rank: {kind} rank should not be the same as the rank "
                         "of the current process.")
    return r


def _p2p(kind, tensor, peer, group, tag, group_peer, array, on_done=None):
    collective = "isend" if kind == "send" else "irecv"
    g = _group(group, collective)
    if g is None:
        return None
    if isinstance(tag, bool) or not isinstance(tag, int):
        raise TypeError(f"{collective}: tag must be an int, not {type(tag).__name__}")
    param = "dst" if kind == "send" else "src"
    if kind == "recv" and peer is None and group_peer is None:
        r = None
    else:
        r = _peer(g, peer, group_peer, param, collective)
    if g._state is None:
        raise RuntimeError(f"{collective}: the group has one rank; there is no peer")
    work = Work([tensor] if tensor is not None else [])
    state = g._state
    target = state.ranks[r] if r is not None else None
    return _world.comm.submit_p2p(state, kind, target, tag, array, work, on_done)


def isend(tensor, dst=None, group=None, tag=0, group_dst=None):
    """Send ``tensor`` to rank ``dst``; the returned Work completes once it is on its way."""
    _tensor(tensor, "tensor")
    return _p2p("send", tensor, dst, group, tag, group_dst, _flat(tensor))


def irecv(tensor, src=None, group=None, tag=0, group_src=None):
    """Receive into ``tensor`` from rank ``src`` (None: any rank; ``Work.source_rank``)."""
    _tensor(tensor, "tensor")
    out = _Out(tensor, "irecv")
    return _p2p("recv", tensor, src, group, tag, group_src, out.flat, out.done)


def send(tensor, dst=None, group=None, tag=0, group_dst=None):
    work = isend(tensor, dst, group, tag, group_dst)
    if work is not None:
        work.wait()


def recv(tensor, src=None, group=None, tag=0, group_src=None):
    """Receive into ``tensor``; return the sender's global rank."""
    work = irecv(tensor, src, group, tag, group_src)
    if work is None:
        return -1
    work.wait()
    return work.source_rank()


class P2POp:
    """One send or recv of :func:`batch_isend_irecv` (``op`` is ``isend`` or ``irecv``)."""

    def __init__(self, op, tensor, peer=None, group=None, tag=0, group_peer=None):
        if op not in (isend, irecv, send, recv):
            raise ValueError("Invalid ``op``. Expected ``op`` to be of type ``torch.distributed."
                             "isend`` or ``torch.distributed.irecv``.")
        self.op = isend if op in (isend, send) else irecv
        self.tensor, self.peer, self.group, self.tag, self.group_peer = (tensor, peer, group,
                                                                         tag, group_peer)


def batch_isend_irecv(p2p_op_list):
    """Start every op of the list; return their Works."""
    if not p2p_op_list or not all(isinstance(p, P2POp) for p in p2p_op_list):
        raise ValueError("Invalid ``p2p_op_list``. Each op is expected to to be of type "
                         "``torch.distributed.P2POp``.")
    return [p.op(p.tensor, p.peer, p.group, p.tag, p.group_peer) for p in p2p_op_list]


# ---------------------------------------------------------------------- objects
def _encode(obj):
    return np.frombuffer(codec.dumps(obj), dtype=np.uint8)


def _decode(a):
    return codec.loads(bytes(a))


def all_gather_object(object_list, obj, group=None):
    """``object_list[i]`` = ``obj`` of rank ``i``, on every rank."""
    g = _group(group, "all_gather_object")
    if g is None:
        return
    if not isinstance(object_list, list) or len(object_list) != g.size():
        raise ValueError(f"all_gather_object: object_list must be a list of {g.size()} "
                         "elements (one per rank)")
    got = [None] * g.size()
    _run(g, _fp("all_gather_object"), alg.all_to_all([_encode(obj)] * g.size(),
                                                     got.__setitem__))
    object_list[:] = [_decode(x) for x in got]


def broadcast_object_list(object_list, src=None, group=None, device=None, group_src=None):
    """The objects of ``object_list`` on rank ``src`` replace those of every rank (the
    lists have one length everywhere)."""
    g = _group(group, "broadcast_object_list")
    if g is None:
        return
    root = _root(g, src, group_src, "src", "broadcast_object_list")
    box = [_encode(list(object_list)) if g.rank() == root else None]
    _run(g, _fp("broadcast_object_list", src=root),
         alg.scatter([box[0]] * g.size() if g.rank() == root else None, root,
                     lambda x: box.__setitem__(0, x)))
    objs = _decode(box[0])
    if len(objs) != len(object_list):
        raise ValueError(f"broadcast_object_list: rank {root} sent {len(objs)} objects, this "
                         f"rank's object_list has {len(object_list)}")
    object_list[:] = objs


def gather_object(obj, object_gather_list=None, dst=None, group=None, group_dst=None):
    """``object_gather_list[i]`` on rank ``dst`` = ``obj`` of rank ``i``."""
    g = _group(group, "gather_object")
    if g is None:
        return
    root = _root(g, dst, group_dst, "dst", "gather_object")
    got = None
    if g.rank() == root:
        if not isinstance(object_gather_list, list) or len(object_gather_list) != g.size():
            raise ValueError(f"gather_object: object_gather_list must be a list of {g.size()} "
                             "elements on the destination rank")
        got = [None] * g.size()
    _run(g, _fp("gather_object", dst=root), alg.gather(_encode(obj), got, root))
    if got is not None:
        object_gather_list[:] = [_decode(x) for x in got]


def scatter_object_list(scatter_object_output_list, scatter_object_input_list=None, src=None,
                        group=None, group_src=None):
    """``scatter_object_output_list[0]`` on rank ``i`` = ``scatter_object_input_list[i]``
    of rank ``src``."""
    g = _group(group, "scatter_object_list")
    if g is None:
        return
    root = _root(g, src, group_src, "src", "scatter_object_list")
    if not isinstance(scatter_object_output_list, list) or not scatter_object_output_list:
        raise ValueError("Expected argument scatter_object_output_list to be a list of size at "
                         "least 1.")
    ins = None
    if g.rank() == root:
        if not isinstance(scatter_object_input_list, (list, tuple)) \
                or len(scatter_object_input_list) != g.size():
            raise ValueError(f"scatter_object_list: scatter_object_input_list must have "
                             f"{g.size()} objects on the source rank")
        ins = [_encode(o) for o in scatter_object_input_list]
    box = [None]
    _run(g, _fp("scatter_object_list", src=root),
         alg.scatter(ins, root, lambda x: box.__setitem__(0, x)))
    scatter_object_output_list[0] = _decode(box[0])


def send_object_list(object_list, dst=None, group=None, device=None, group_dst=None,
                     use_batch=False):
    """Send the objects of ``object_list`` to rank ``dst`` (``recv_object_list`` there)."""
    if not isinstance(object_list, list):
        raise TypeError("send_object_list: object_list must be a list")
    work = _p2p("send", None, dst, group, 0, group_dst, _encode(list(object_list)))
    if work is not None:
        work.wait()


def recv_object_list(object_list, src=None, group=None, device=None, group_src=None,
                     use_batch=False):
    """Fill ``object_list`` with the objects rank ``src`` sent; return the sender's rank."""
    if not isinstance(object_list, list):
        raise TypeError("recv_object_list: object_list must be a list")
    work = _p2p("recv", None, src, group, 0, group_src, None)
    if work is None:
        return -1
    work.wait()
    objs = _decode(work._result[0])
    if len(objs) != len(object_list):
        raise ValueError(f"recv_object_list: {len(objs)} objects arrived, object_list has "
                         f"{len(object_list)}")
    object_list[:] = objs
    return work.source_rank()

"""``DistributedDataParallel``: one replica of a module per process, gradients averaged.

The implementation of ``distgrad.nn.parallel.DistributedDataParallel`` (PyTorch's path,
where the type is declared): it lives here, above the process groups it uses, and
registers itself with that type when ``distgrad.distributed`` is imported.

At construction every rank checks that all ranks hold the same parameters (count,
names, shapes, dtypes; a mismatch is an error on every rank that names it) and
takes rank 0's parameters and buffers. Gradients are averaged in *buckets* of
about ``bucket_cap_mb`` (with the default cap the first one is 1 MB, so communication
starts early),
filled in reverse registration order, which is about the order backward produces
them. When the last gradient of a bucket (or of a few-MB segment of a large bucket,
see ``_Unit``) has accumulated (a post hook on each parameter's ``AccumulateGrad``
node), its averaging all-reduce starts asynchronously on the process group's I/O
thread, while backward goes on computing the gradients of earlier layers. They
start in the same order on every rank, so every rank issues the same collectives
in the same order. When the last one has started, backward waits for all of them
and writes the averages back into ``.grad`` (or into the bucket views they already
are, with ``gradient_as_bucket_view=True``).

Inside a distributed autograd context the gradients of a pass accumulate in the
context, not in ``.grad``; the same hooks then read and replace the context's
gradients (as PyTorch's DDP does for its DDP + RPC example).

In every process of an initialised process group (a complete program:
``scripts/example_ddp.py``)::

    model = DistributedDataParallel(net)
    loss_fn(model(x), y).backward()   # .grad now holds the average over all ranks
"""
import contextlib
import itertools
import warnings

import numpy as np

from ..autograd.grad_mode import no_grad
from ..autograd._internal import (AccumulateGrad, array_of, bump_version, grad_edge,
                                  grad_mode_state, wrap)
from .._tensor import Tensor
from ..nn.modules.module import Module
from ..nn.parallel import distributed as _declared
from .autograd.recording import running_pass
from .collectives import all_reduce, broadcast
from .object_collectives import all_gather_object
from .process_group import get_global_rank, get_rank, get_world_size, group
from .reduce_op import ReduceOp

__all__ = ["DistributedDataParallel"]

_FIRST_BUCKET_BYTES = 1 << 20
_DEFAULT_BUCKET_MB = 25
_SEGMENT_BYTES = 4 << 20  # see _Unit
_IN_PLACE_BYTES = 1 << 20  # see _Unit


class _Bucket:
    """Gradients of some parameters (one dtype) in one flat buffer."""

    __slots__ = ("index", "params", "ids", "flat", "views", "offsets")

    def __init__(self, index, params, dtype):
        self.index, self.params = index, params
        self.ids = []  # each parameter's index in the module's parameter list
        sizes = [array_of(p).size for p in params]
        self.offsets = list(itertools.accumulate([0] + sizes))
        self.flat = np.zeros(self.offsets[-1], dtype=dtype)
        self.views = [self.flat[a:b].reshape(array_of(p).shape)
                      for p, a, b in zip(params, self.offsets, self.offsets[1:])]


class _Unit:
    """Parameters ``lo:hi`` of a bucket whose all-reduce starts as one: the whole bucket
    when a comm hook is registered (it is given buckets), otherwise segments of a few MB,
    so that the last gradient of a large bucket does not hold back the all-reduce of the
    rest of it: what backward still waits for at its end is at most one segment.

    A parameter of at least ``_IN_PLACE_BYTES`` is a unit of its own (``alone``), whose
    all-reduce runs on its gradient itself (``target``: the flat view of ``.grad``) rather
    than on a copy in the bucket: copying a large gradient into the bucket and the
    average back costs the backward thread two passes over it (on ``wide``, 8 MB of
    copies a layer, as much CPU as the all-reduce's own arithmetic). Its bucket slot stays:
    a gradient that cannot be reduced in place (missing, not contiguous, in a distributed
    autograd context) takes it, with the same shape, so ranks that choose differently
    still issue the same collective."""

    __slots__ = ("bucket", "lo", "hi", "flat", "pending", "work", "alone", "target")

    def __init__(self, bucket, lo, hi, alone=False):
        self.bucket, self.lo, self.hi = bucket, lo, hi
        self.flat = bucket.flat[bucket.offsets[lo]:bucket.offsets[hi]]
        self.pending = hi - lo
        self.work = None
        self.alone = alone    # one large parameter, reduced in place when it can be
        self.target = None    # this pass: its gradient's flat view, when reduced in place


def _memory_of(a):
    """What identifies the memory of array ``a`` (its base's, for a view)."""
    return id(a.base if a.base is not None else a)


def _units(buckets, segment_bytes, in_place_bytes=0):
    units = []
    for b in buckets:
        lo, size = 0, 0
        for k, p in enumerate(b.params):
            nbytes = array_of(p).nbytes
            if in_place_bytes and nbytes >= in_place_bytes:
                if lo < k:
                    units.append(_Unit(b, lo, k))
                units.append(_Unit(b, k, k + 1, alone=True))
                lo, size = k + 1, 0
                continue
            size += nbytes
            if segment_bytes and size >= segment_bytes and k + 1 < len(b.params):
                units.append(_Unit(b, lo, k + 1))
                lo, size = k + 1, 0
        if lo < len(b.params):
            units.append(_Unit(b, lo, len(b.params)))
    return units


def _assign_buckets(params, cap_bytes, first_bytes):
    """Buckets of parameters in reverse registration order, one dtype each; the first
    closes at ``first_bytes``, the others at ``cap_bytes``."""
    open_buckets, done = {}, []
    limit = {}
    for p in reversed(params):
        dt = array_of(p).dtype
        cur = open_buckets.setdefault(dt, [])
        cur.append(p)
        size = sum(array_of(q).nbytes for q in cur)
        if size >= limit.get(dt, first_bytes):
            done.append((dt, cur))
            open_buckets[dt] = []
            limit[dt] = cap_bytes
    done += [(dt, cur) for dt, cur in open_buckets.items() if cur]
    return [_Bucket(i, ps, dt) for i, (dt, ps) in enumerate(done)]


def _leaf_gradient_sink():
    """The distributed autograd context a running pass accumulates leaf gradients in, or
    None when they go to ``.grad``."""
    dist_pass = running_pass()
    return dist_pass.ctx if dist_pass is not None else None


def _reachable_params(outputs, params):
    """The parameters (of ``params``) whose gradient the graph of ``outputs`` reaches."""
    wanted = {id(grad_edge(p)[0]): i for i, p in enumerate(params)}
    found, seen, stack = set(), set(), []

    def collect(x):
        if isinstance(x, Tensor):
            if x.requires_grad:
                stack.append(grad_edge(x)[0])
        elif isinstance(x, (list, tuple)):
            for y in x:
                collect(y)
        elif isinstance(x, dict):
            for y in x.values():
                collect(y)
    collect(outputs)
    while stack:
        node = stack.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        if type(node) is AccumulateGrad:
            i = wanted.get(id(node))
            if i is not None:
                found.add(i)
            continue
        for nxt, _ in node.next_functions:
            if nxt is not None:
                stack.append(nxt)
    return found


class DistributedDataParallel(_declared.DistributedDataParallel):
    """``torch.nn.parallel.DistributedDataParallel`` over ``distgrad.distributed``."""

    def __init__(self, module, device_ids=None, output_device=None, dim=0,
                 broadcast_buffers=None, init_sync=True, process_group=None,
                 bucket_cap_mb=None, find_unused_parameters=False, check_reduction=False,
                 gradient_as_bucket_view=False, static_graph=False,
                 delay_all_reduce_named_params=None, param_to_hook_all_reduce=None,
                 mixed_precision=None, device_mesh=None, skip_all_reduce_unused_params=False,
                 bucket_cap_mb_list=None, batched_grad_copy=False, forward_sync_buffers=None):
        super().__init__()
        if not isinstance(module, Module):
            raise TypeError(f"DistributedDataParallel: module must be an nn.Module, not "
                            f"{type(module).__name__}")
        if device_ids or output_device is not None:
            raise ValueError(f"DistributedDataParallel device_ids and output_device arguments "
                             f"only work with single-device/multiple-device GPU modules; this "
                             f"CPU module got device_ids {device_ids}, output_device "
                             f"{output_device}")
        if mixed_precision is not None or device_mesh is not None:
            raise ValueError("DistributedDataParallel: mixed_precision and device_mesh are "
                             "not supported (CPU only)")
        self.module = module
        self.process_group = process_group if process_group is not None else group.WORLD
        if self.process_group is None:
            raise ValueError("Default process group has not been initialized, please make "
                             "sure to call init_process_group.")
        self.world_size = get_world_size(self.process_group)
        self.rank = get_rank(self.process_group)
        self.dim = dim
        self.broadcast_buffers = True if broadcast_buffers is None else bool(broadcast_buffers)
        self.find_unused_parameters = find_unused_parameters
        self.gradient_as_bucket_view = gradient_as_bucket_view
        self.static_graph = static_graph
        self.require_backward_grad_sync = True
        self.require_forward_param_sync = True
        self._comm_hook = None
        named = [(n, p) for n, p in module.named_parameters() if p.requires_grad]
        self._param_names = [n for n, _ in named]
        self._params = [p for _, p in named]
        if not self._params:
            raise RuntimeError("DistributedDataParallel is not needed when a module doesn't "
                               "have any parameter that requires a gradient.")
        self._verify_same_model()
        if init_sync:
            self._broadcast_coalesced(self._params + [b for b in module.buffers()])
        # as PyTorch: with the default cap, a small first bucket starts communication early
        cap = int((_DEFAULT_BUCKET_MB if bucket_cap_mb is None else bucket_cap_mb) * (1 << 20))
        self._buckets = _assign_buckets(self._params, cap,
                                        _FIRST_BUCKET_BYTES if bucket_cap_mb is None else cap)
        index = {id(p): i for i, p in enumerate(self._params)}
        for b in self._buckets:
            b.ids = [index[id(p)] for p in b.params]
        self._plan_units(_SEGMENT_BYTES, 0 if gradient_as_bucket_view else _IN_PLACE_BYTES)
        self._hooks = []
        # Held here, as PyTorch's Reducer holds them: a leaf refers to its accumulator
        # weakly, and the hooks must stay on the one its forward passes use.
        self._grad_accumulators = [grad_edge(p)[0] for p in self._params]
        for i, acc in enumerate(self._grad_accumulators):
            self._hooks.append(acc.register_hook(self._make_hook(i)))
        self._reset_iteration(active=False)

    # ------------------------------------------------------------------ construction
    def _verify_same_model(self):
        mine = [[n, list(array_of(p).shape), array_of(p).dtype.name]
                for n, p in zip(self._param_names, self._params)]
        every = [None] * self.world_size
        all_gather_object(every, mine, group=self.process_group)
        for r, theirs in enumerate(every):
            if len(theirs) != len(mine):
                raise RuntimeError(f"DDP expects same model across all ranks, but Rank "
                                   f"{self.rank} has {len(mine)} params, while rank {r} has "
                                   f"inconsistent {len(theirs)} params.")
            for (n, shape, dt), (n2, shape2, dt2) in zip(mine, theirs):
                if shape != shape2 or dt != dt2:
                    raise RuntimeError(f"DDP expects same model across all ranks, but Rank "
                                       f"{self.rank} has parameter {n!r} of shape {shape} "
                                       f"({dt}) while rank {r} has {n2!r} of shape {shape2} "
                                       f"({dt2}) at that position.")

    def _broadcast_coalesced(self, tensors):
        """Every rank takes group rank 0's values of ``tensors`` (one message per dtype)."""
        src = get_global_rank(self.process_group, 0) \
            if self.process_group is not group.WORLD else 0
        by_dtype = {}
        for t in tensors:
            by_dtype.setdefault(array_of(t).dtype, []).append(t)
        for dt, ts in by_dtype.items():
            flat = np.concatenate([np.ascontiguousarray(array_of(t)).reshape(-1) for t in ts])
            broadcast(wrap(flat), src=src, group=self.process_group)
            if self.rank != 0:
                at = 0
                for t in ts:
                    n = array_of(t).size
                    array_of(t)[...] = flat[at:at + n].reshape(array_of(t).shape)
                    bump_version(t)
                    at += n

    # ------------------------------------------------------------------ forward
    def forward(self, *inputs, **kwargs):
        if self._active and self._started:
            self._raise_unfinished()
        sync = self.require_backward_grad_sync and grad_mode_state.grad_enabled
        if self.require_forward_param_sync and self.broadcast_buffers and self.world_size > 1:
            buffers = list(self.module.buffers())
            if buffers:
                with no_grad():
                    self._broadcast_coalesced(buffers)
        out = self.module(*inputs, **kwargs)
        self._reset_iteration(active=sync and self.world_size > 1)
        if self._active and self.find_unused_parameters:
            used = _reachable_params(out, self._params)
            self._locally_used = used
            for i in range(len(self._params)):
                if i not in used:
                    self._mark_ready(i, sink=None, unused=True)
        return out

    def _plan_units(self, segment_bytes, in_place_bytes=0):
        self._units = _units(self._buckets, segment_bytes, in_place_bytes)
        self._where = {}  # param index -> (unit, bucket, position in the bucket)
        for u in self._units:
            for k in range(u.lo, u.hi):
                self._where[u.bucket.ids[k]] = (u, u.bucket, k)

    def _reset_iteration(self, active):
        self._active = active        # gradients of the coming backward get averaged
        self._started = False        # a gradient of this iteration arrived
        self._ready = set()
        self._next_unit = 0
        self._locally_used = None
        self._sink = None            # the distributed autograd context of this backward
        self._shared_grads = None    # memory that several parameters' .grad share (this pass)
        for u in self._units:
            u.pending = u.hi - u.lo
            u.work = u.target = None

    def _raise_unfinished(self):
        missing = [i for i in range(len(self._params)) if i not in self._ready]
        names = [self._param_names[i] for i in missing]
        self._active = False
        raise RuntimeError(
            "Expected to have finished reduction in the prior iteration before starting a new "
            "one. This error indicates that your module has parameters that were not used in "
            "producing loss. You can enable unused parameter detection by passing the keyword "
            "argument `find_unused_parameters=True` to "
            "`torch.nn.parallel.DistributedDataParallel`, and by making sure all `forward` "
            "function outputs participate in calculating loss.\nParameter indices which did "
            f"not receive grad for rank {self.rank}: {' '.join(map(str, missing))}\n"
            f"Parameters which did not receive grad for rank {self.rank}: {', '.join(names)}")

    @contextlib.contextmanager
    def no_sync(self):
        """Within the block, backward accumulates gradients locally (no all-reduce); the
        first backward after it averages what accumulated."""
        old = self.require_backward_grad_sync
        self.require_backward_grad_sync = False
        try:
            yield
        finally:
            self.require_backward_grad_sync = old

    # ------------------------------------------------------------------ backward
    def _make_hook(self, i):
        def hook(grad_inputs, grad_outputs):
            if self._active:
                self._mark_ready(i, _leaf_gradient_sink(), unused=False)
        return hook

    def _mark_ready(self, i, sink, unused):
        if i in self._ready:
            if unused:
                return
            raise RuntimeError(
                f"Expected to mark a variable ready only once. This error is caused by one of "
                f"the following reasons: 1) Use of a module parameter outside the `forward` "
                f"function, or a backward run twice through the graph of one forward. "
                f"Parameter {self._param_names[i]!r} (index {i}) got a second gradient in "
                f"this iteration.")
        self._started = True
        self._ready.add(i)
        unit, bucket, k = self._where[i]
        if not (unit.alone and self._reduce_in_place(unit, bucket.params[k], sink, unused)):
            self._fill(bucket, k, sink, unused)
        unit.pending -= 1
        if self._sink is None and sink is not None:
            self._sink = sink
        units = self._units  # they start in order: every rank issues the same all-reduces
        while self._next_unit < len(units) and units[self._next_unit].pending == 0:
            self._launch(units[self._next_unit])
            self._next_unit += 1
        if self._next_unit == len(units) and not unused:
            self._finalize()

    def _grad_of(self, p, sink):
        if sink is not None:
            with sink.lock:
                return sink.grads.get(p)
        g = p.grad
        return array_of(g) if g is not None else None

    def _reduce_in_place(self, unit, p, sink, unused):
        """Whether ``unit`` (one large parameter ``p``) is reduced in ``p``'s own gradient
        this pass: a contiguous, writable ``.grad`` (not a distributed autograd context's)."""
        if unused or sink is not None:
            return False
        g = p.grad
        a = array_of(g) if g is not None else None
        if type(a) is not np.ndarray or not a.flags.c_contiguous or not a.flags.writeable \
                or a.size != unit.flat.size or a.dtype != unit.flat.dtype:
            return False
        # memory that several parameters' .grad share (a user may have assigned one .grad
        # to two parameters) takes the buckets: the collective would write into it while
        # backward still adds the other parameter's gradient there
        if self._shared_grads is None:
            self._shared_grads = self._grad_memory_shared()
        if _memory_of(a) in self._shared_grads:
            return False
        unit.target = a.reshape(-1)
        return True

    def _grad_memory_shared(self):
        """The memory (``_memory_of``) of the ``.grad`` of more than one parameter."""
        seen, shared = set(), set()
        for q in self._params:
            g = q.grad
            if g is not None:
                m = _memory_of(array_of(g))
                (shared if m in seen else seen).add(m)
        return shared

    def _fill(self, bucket, k, sink, unused):
        view = bucket.views[k]
        g = None if unused else self._grad_of(bucket.params[k], sink)
        if g is None:
            view[...] = 0
        elif g is not view:
            view[...] = g

    def _launch(self, unit):
        if self._comm_hook is not None:
            state, hook = self._comm_hook
            unit.work = hook(state, GradBucket(unit.bucket, len(self._buckets)))
            return
        # AVG divides on the communicator's thread, each rank only its share of the ring
        flat = unit.flat if unit.target is None else unit.target
        unit.work = all_reduce(wrap(flat), op=ReduceOp.AVG, group=self.process_group,
                               async_op=True).get_future()

    def _finalize(self):
        """Every bucket started: wait for them and write the averages where the gradients
        of this pass live."""
        sink, self._sink = self._sink, None
        used_anywhere = None
        if self.find_unused_parameters:
            used = np.zeros(len(self._params), dtype=np.int64)
            used[sorted(self._locally_used)] = 1
            all_reduce(wrap(used), group=self.process_group)
            used_anywhere = used
        for u in self._units:
            result = u.work.wait()
            if isinstance(result, list):
                result = result[0]
            if u.target is not None:  # reduced in the gradient itself
                bump_version(u.bucket.params[u.lo].grad)
                continue
            if isinstance(result, Tensor) and array_of(result) is not u.flat:
                u.flat[...] = array_of(result).reshape(-1)
            b = u.bucket
            for k in range(u.lo, u.hi):
                if used_anywhere is not None and not used_anywhere[b.ids[k]]:
                    continue  # no rank used it: its gradient stays as it is (None)
                self._write_back(b.params[k], b.views[k], sink)
        self._active = False

    def _write_back(self, p, view, sink):
        if sink is not None:
            with sink.lock:
                sink.grads[p] = view.copy()
            return
        g = p.grad
        if self.gradient_as_bucket_view:
            if g is None or array_of(g) is not view:
                p.grad = wrap(view)
            else:
                bump_version(g)
        elif g is None:
            p.grad = wrap(view.copy())
        else:
            array_of(g)[...] = view
            bump_version(g)

    # ------------------------------------------------------------------ comm hooks
    def register_comm_hook(self, state, hook):
        """Replace the bucket all-reduce with ``hook(state, bucket) -> Future`` whose value
        is the bucket's new tensor (``bucket.buffer()`` is its flat gradient tensor)."""
        if self._comm_hook is not None:
            raise RuntimeError("register_comm_hook or register_builtin_comm_hook can only be "
                               "called once.")
        if not callable(hook):
            raise TypeError("Communication hook must be callable.")
        self._comm_hook = (state, hook)
        self._plan_units(0)  # the hook is given whole buckets
        self._reset_iteration(active=False)

    def will_sync_module_buffers(self):
        return self.require_forward_param_sync and self.broadcast_buffers \
            and any(True for _ in self.module.buffers())

    def _set_static_graph(self):
        self.static_graph = True
        warnings.warn("You've set static_graph to be True; distgrad's DDP treats every graph "
                      "the same way, so this changes nothing.", stacklevel=2)


class GradBucket:
    """What a comm hook sees of a bucket (``torch.distributed.GradBucket``)."""

    def __init__(self, bucket, count):
        self._b, self._count = bucket, count

    def index(self):
        return self._b.index

    def buffer(self):
        return wrap(self._b.flat)

    def gradients(self):
        return [wrap(v) for v in self._b.views]

    def parameters(self):
        return list(self._b.params)

    def is_last(self):
        return self._b.index == self._count - 1

    def set_buffer(self, tensor):
        self._b.flat[...] = array_of(tensor).reshape(-1)


_declared.implemented_by(DistributedDataParallel)

"""What the ranks of a ``pg_world.World`` run: each case checks its results against a NumPy
reference on the rank itself and returns digests, so the test can check that every rank
holds the same bits."""
import hashlib
import os
import signal
import time
import zlib

import numpy as np

import distgrad
import distgrad.distributed as dist
from distgrad.distributed import ReduceOp
from support import pg_world

CASES, case = pg_world.registry()


def configure(options):
    from distgrad.distributed import algorithms, comm
    if "piece_bytes" in options:
        algorithms.PIECE_BYTES = options["piece_bytes"]
    if "shm_threshold" in options:
        comm._SHM_THRESHOLD = options["shm_threshold"]


class Context(pg_world.Context):
    """A rank's view of the world, with groups of its first 1, 2, ... n ranks."""

    def __init__(self, rank, n, store, options):
        super().__init__(rank, n, store, options)
        self.groups = {k: dist.new_group(list(range(k))) for k in range(1, n)}
        self.groups[n] = None

    def sizes(self):
        """Group sizes this rank takes part in."""
        return [k for k in range(1, self.n + 1) if self.rank < k]


# ---------------------------------------------------------------------- data
LAYOUTS = ("plain", "scalar", "strided", "large")
_SHAPES = {"plain": (3, 4), "scalar": (), "strided": (5, 3), "large": (40_003,)}


def array(seed, rank, layout, dtype):
    """The deterministic input of ``rank`` (before any transposition)."""
    rng = np.random.default_rng(seed * 1000 + rank)
    shape = _SHAPES[layout]
    dt = np.dtype(dtype)
    if dt.kind == "f":
        a = rng.standard_normal(shape)
    elif dt.kind == "c":
        a = rng.standard_normal(shape) + 1j * rng.standard_normal(shape)
    elif dt.kind == "b":
        a = rng.random(shape) > 0.5
    else:
        a = rng.integers(-5, 6, shape)
    return np.asarray(a).astype(dt)  # 0-d draws come back as scalars


def tensor(seed, rank, layout, dtype):
    """The input as a tensor; "strided" is a transposed (non-contiguous) view."""
    a = array(seed, rank, layout, dtype)
    t = distgrad.tensor(a)
    return t.t() if layout == "strided" else t


def value(seed, rank, layout, dtype):
    a = array(seed, rank, layout, dtype)
    return a.T if layout == "strided" else a


def digest(t):
    a = t._data if isinstance(t, distgrad.Tensor) else np.asarray(t)
    h = hashlib.sha256(np.ascontiguousarray(a).tobytes())
    h.update(str((a.shape, a.dtype.str)).encode())
    return h.hexdigest()[:16]


def check(got, want, what):
    got = got._data if isinstance(got, distgrad.Tensor) else np.asarray(got)
    want = np.asarray(want)
    assert got.shape == want.shape, f"{what}: shape {got.shape}, expected {want.shape}"
    assert got.dtype == want.dtype, f"{what}: dtype {got.dtype}, expected {want.dtype}"
    if got.dtype.kind in "fc":
        tol = 1e-5 if got.dtype in (np.float32, np.complex64) else 1e-12
        np.testing.assert_allclose(got, want, rtol=tol, atol=tol, err_msg=what)
    else:
        np.testing.assert_array_equal(got, want, err_msg=what)


_NP = {ReduceOp.SUM: np.add, ReduceOp.PRODUCT: np.multiply, ReduceOp.MIN: np.minimum,
       ReduceOp.MAX: np.maximum, ReduceOp.BAND: np.bitwise_and, ReduceOp.BOR: np.bitwise_or,
       ReduceOp.BXOR: np.bitwise_xor}


def reference(arrays, op):
    if arrays[0].dtype == np.bool_:
        ufunc = np.logical_or if op in (ReduceOp.SUM, ReduceOp.MAX) else np.logical_and
    else:
        ufunc = _NP.get(op, np.add)
    acc = arrays[0].copy()
    for a in arrays[1:]:
        acc = ufunc(acc, a)
    if op == ReduceOp.AVG:
        acc = (acc / len(arrays)).astype(arrays[0].dtype)
    return acc


OPS = {"float32": ("SUM", "AVG", "PRODUCT", "MIN", "MAX"), "float64": ("SUM", "AVG", "MAX"),
       "int64": ("SUM", "PRODUCT", "MIN", "MAX", "BAND", "BOR", "BXOR"),
       "bool": ("SUM", "PRODUCT", "MIN", "MAX"), "complex128": ("SUM", "PRODUCT", "AVG")}


# ---------------------------------------------------------------------- collectives
@case
def all_reduce(ctx, dtype, layouts):
    out = {}
    for k in ctx.sizes():
        g = ctx.groups[k]
        for layout in layouts:
            for opname in OPS[dtype]:
                op = getattr(ReduceOp, opname)
                seed = zlib.crc32(f"{layout}{opname}".encode()) % 1000
                x = tensor(seed, ctx.rank, layout, dtype)
                base = x._base if layout == "strided" else None
                dist.all_reduce(x, op=op, group=g)
                want = reference([value(seed, r, layout, dtype) for r in range(k)], op)
                check(x, want, f"all_reduce {opname} {layout} {dtype} over {k} ranks")
                if base is not None:  # the view wrote through to its base
                    check(base, want.T, "base of the strided view")
                out[f"{k}/{layout}/{opname}"] = digest(x)
    return out


@case
def all_reduce_doubling(ctx, dtype):
    """Small all-reduces by recursive doubling (for 3 ranks: one folded rank)."""
    from distgrad.distributed import algorithms
    old, algorithms.DIRECT_MAX_RANKS = algorithms.DIRECT_MAX_RANKS, 1
    try:
        return all_reduce(ctx, dtype, ["plain", "scalar", "strided"])
    finally:
        algorithms.DIRECT_MAX_RANKS = old


@case
def all_reduce_halving(ctx, dtype):
    """All-reduces by recursive halving and doubling, of every size (for 3 ranks: one
    folded rank; tensors of fewer elements than ranks: empty chunks)."""
    from distgrad.distributed import algorithms
    saved = algorithms.DIRECT_MAX_RANKS, algorithms.SMALL_BYTES, algorithms.HALVING_MAX_BYTES
    algorithms.DIRECT_MAX_RANKS, algorithms.SMALL_BYTES, algorithms.HALVING_MAX_BYTES = \
        1, 0, 1 << 40
    try:
        return all_reduce(ctx, dtype, ["plain", "scalar", "strided", "large"])
    finally:
        algorithms.DIRECT_MAX_RANKS, algorithms.SMALL_BYTES, algorithms.HALVING_MAX_BYTES = \
            saved


@case
def broadcast(ctx, dtype, layouts):
    out = {}
    for k in ctx.sizes():
        for layout in layouts:
            for src in range(k):
                x = tensor(src, ctx.rank, layout, dtype)
                dist.broadcast(x, src=src, group=ctx.groups[k])
                check(x, value(src, src, layout, dtype), f"broadcast from {src} of {k}")
                out[f"{k}/{layout}/{src}"] = digest(x)
    return out


@case
def reduce(ctx, dtype, layouts):
    out = {}
    for k in ctx.sizes():
        for layout in layouts:
            for dst in range(k):
                for opname in ("SUM", "MAX"):
                    op = getattr(ReduceOp, opname)
                    x = tensor(dst + 7, ctx.rank, layout, dtype)
                    dist.reduce(x, dst=dst, op=op, group=ctx.groups[k])
                    if ctx.rank == dst:
                        want = reference([value(dst + 7, r, layout, dtype) for r in range(k)],
                                         op)
                    else:  # the other ranks keep their input
                        want = value(dst + 7, ctx.rank, layout, dtype)
                    check(x, want, f"reduce {opname} to {dst} of {k} ({layout})")
    return out


@case
def all_gather(ctx, dtype, layouts):
    out = {}
    for k in ctx.sizes():
        g = ctx.groups[k]
        for layout in layouts:
            x = tensor(3, ctx.rank, layout, dtype)
            outs = [distgrad.zeros(tuple(x.shape), dtype=x.dtype) for _ in range(k)]
            dist.all_gather(outs, x, group=g)
            for r in range(k):
                check(outs[r], value(3, r, layout, dtype), f"all_gather[{r}] of {k}")
            # into one tensor: stacked, and concatenated along dim 0
            stacked = np.stack([value(3, r, layout, dtype) for r in range(k)])
            shapes = [(k,) + tuple(x.shape)]
            if x.dim():
                shapes.append((k * x.shape[0],) + tuple(x.shape[1:]))
            for shape in shapes:
                o = distgrad.zeros(shape, dtype=x.dtype)
                dist.all_gather_into_tensor(o, x, group=g)
                check(o, stacked.reshape(shape), f"all_gather_into_tensor {shape}")
                out[f"{k}/{layout}/{shape}"] = digest(o)
    return out


@case
def reduce_scatter(ctx, dtype, layouts):
    out = {}
    for k in ctx.sizes():
        g = ctx.groups[k]
        for layout in layouts:
            ins = [tensor(10 + i, ctx.rank, layout, dtype) for i in range(k)]
            o = distgrad.zeros(tuple(ins[0].shape), dtype=ins[0].dtype)
            dist.reduce_scatter(o, ins, group=g)
            want = reference([value(10 + ctx.rank, r, layout, dtype) for r in range(k)],
                             ReduceOp.SUM)
            check(o, want, f"reduce_scatter of {k} ({layout})")
            out[f"{k}/{layout}/list"] = digest(o)
            # one input tensor of k blocks
            big = distgrad.tensor(np.stack([value(20 + i, ctx.rank, layout, dtype)
                                            for i in range(k)]))
            o2 = distgrad.zeros(tuple(ins[0].shape), dtype=ins[0].dtype)
            dist.reduce_scatter_tensor(o2, big, op=ReduceOp.MAX, group=g)
            want = reference([value(20 + ctx.rank, r, layout, dtype) for r in range(k)],
                             ReduceOp.MAX)
            check(o2, want, f"reduce_scatter_tensor of {k} ({layout})")
    return out


@case
def gather_scatter(ctx, dtype, layouts):
    for k in ctx.sizes():
        g = ctx.groups[k]
        for layout in layouts:
            for root in range(k):
                x = tensor(30, ctx.rank, layout, dtype)
                lst = [distgrad.zeros(tuple(x.shape), dtype=x.dtype) for _ in range(k)] \
                    if ctx.rank == root else None
                dist.gather(x, lst, dst=root, group=g)
                if ctx.rank == root:
                    for r in range(k):
                        check(lst[r], value(30, r, layout, dtype), f"gather[{r}] to {root}")
                y = distgrad.zeros(tuple(x.shape), dtype=x.dtype)
                src_list = [tensor(40 + r, root, layout, dtype) for r in range(k)] \
                    if ctx.rank == root else None
                dist.scatter(y, src_list, src=root, group=g)
                check(y, value(40 + ctx.rank, root, layout, dtype), f"scatter from {root}")
    return True


@case
def all_to_all(ctx, dtype):
    for k in ctx.sizes():
        g = ctx.groups[k]
        # rank r sends to rank p a block of (r + p + 1) rows: sizes differ per pair
        ins = [distgrad.tensor(value(100 * ctx.rank + p, 0, "plain", dtype)[:1].repeat(
            ctx.rank + p + 1, axis=0)) for p in range(k)]
        outs = [distgrad.zeros(p + ctx.rank + 1, 4, dtype=ins[0].dtype) for p in range(k)]
        dist.all_to_all(outs, ins, group=g)
        for p in range(k):
            want = value(100 * p + ctx.rank, 0, "plain", dtype)[:1].repeat(p + ctx.rank + 1, 0)
            check(outs[p], want, f"all_to_all from {p}")
        # single tensor, uneven splits: rank r sends p + 1 rows to rank p
        inp = distgrad.tensor(np.concatenate([np.full((p + 1, 2), 10 * ctx.rank + p)
                                              for p in range(k)]).astype(dtype))
        out = distgrad.zeros(k * (ctx.rank + 1), 2, dtype=inp.dtype)
        dist.all_to_all_single(out, inp, [ctx.rank + 1] * k, [p + 1 for p in range(k)],
                               group=g)
        want = np.concatenate([np.full((ctx.rank + 1, 2), 10 * p + ctx.rank)
                               for p in range(k)]).astype(dtype)
        check(out, want, "all_to_all_single")
    return True


@case
def point_to_point(ctx):
    """Ring of sends with tags, receives from any source, batched ops."""
    r, n = ctx.rank, ctx.n
    right, left = (r + 1) % n, (r - 1) % n
    a = distgrad.full((3,), float(r))
    b = distgrad.full((3,), float(r) + 0.5)
    got_a, got_b = distgrad.zeros(3), distgrad.zeros(3)
    # tags pick the message, whatever the order of arrival
    works = [dist.isend(a, right, tag=1), dist.isend(b, right, tag=2)]
    rb = dist.irecv(got_b, left, tag=2)
    ra = dist.irecv(got_a, left, tag=1)
    for w in works + [ra, rb]:
        w.wait()
    check(got_a, np.full(3, float(left), np.float32), "tag 1")
    check(got_b, np.full(3, float(left) + 0.5, np.float32), "tag 2")
    # from any source: rank 0 hears from everybody else
    if r == 0:
        senders = set()
        for _ in range(n - 1):
            t = distgrad.zeros(2, dtype=distgrad.int64)
            src = dist.recv(t, tag=5)
            assert t.tolist() == [src, src], (t.tolist(), src)
            senders.add(src)
        assert senders == set(range(1, n)), senders
    else:
        dist.send(distgrad.tensor([r, r]), 0, tag=5)
    # batch_isend_irecv, and a non-contiguous receive buffer
    base = distgrad.zeros(4, 2)
    ops = [dist.P2POp(dist.isend, distgrad.arange(8.).reshape(2, 4) + r, right),
           dist.P2POp(dist.irecv, base.t(), left)]
    for w in dist.batch_isend_irecv(ops):
        w.wait()
    check(base.t(), np.arange(8.).reshape(2, 4).astype(np.float32) + left, "batched")
    # objects
    if r == 0:
        dist.send_object_list([{"x": 1}, "two", (3,)], dst=1)
    elif r == 1:
        objs = [None] * 3
        assert dist.recv_object_list(objs, src=0) == 0
        assert objs == [{"x": 1}, "two", (3,)], objs
    return True


@case
def objects(ctx):
    out = {}
    for k in ctx.sizes():
        g = ctx.groups[k]
        mine = {"rank": ctx.rank, "t": distgrad.ones(2) * ctx.rank, "s": "x" * ctx.rank}
        every = [None] * k
        dist.all_gather_object(every, mine, group=g)
        assert [e["rank"] for e in every] == list(range(k))
        assert [e["t"].tolist() for e in every] == [[float(r)] * 2 for r in range(k)]
        lst = [ctx.rank, "a"] if ctx.rank == k - 1 else [None, None]
        dist.broadcast_object_list(lst, src=k - 1, group=g)
        assert lst == [k - 1, "a"], lst
        gl = [None] * k if ctx.rank == 0 else None
        dist.gather_object(("g", ctx.rank), gl, dst=0, group=g)
        if ctx.rank == 0:
            assert gl == [("g", r) for r in range(k)], gl
        o = [None]
        dist.scatter_object_list(o, [[r] for r in range(k)] if ctx.rank == 0 else None, src=0,
                                 group=g)
        assert o == [[ctx.rank]], o
        out[k] = len(every)
    return out


@case
def async_ops(ctx):
    """Several collectives in flight at once, waited for in another order."""
    n = ctx.n
    xs = [distgrad.full((1000,), float(i + ctx.rank)) for i in range(6)]
    works = [dist.all_reduce(x, async_op=True) for x in xs]
    bar = dist.barrier(async_op=True)
    futs = [w.get_future().then(lambda f: f.value()[0].sum().item()) for w in works]
    for w in reversed(works):
        assert w.wait() is True
        assert w.is_completed() and w.is_success() and w.exception() is None
    bar.wait()
    want = [1000 * sum(i + r for r in range(n)) for i in range(6)]
    assert [f.wait() for f in futs] == want, ([f.wait() for f in futs], want)
    for i, x in enumerate(xs):
        check(x, np.full(1000, float(sum(i + r for r in range(n))), np.float32), f"async {i}")
    assert works[0].result()[0] is xs[0]
    return True


@case
def barrier_and_ranks(ctx):
    out = []
    for k in ctx.sizes():
        g = ctx.groups[k]
        dist.barrier(group=g)
        out.append([dist.get_rank(g), dist.get_world_size(g)])
    return out


# ---------------------------------------------------------------------- failures
@case
def mismatch(ctx, kind):
    """Every rank calls one thing, except one (or the order differs): all must fail, each
    naming what every rank called."""
    g = dist.new_group(list(range(ctx.n)))
    x = distgrad.ones(4)
    try:
        if kind == "op":
            if ctx.rank == ctx.n - 1:
                dist.broadcast(x, src=0, group=g)
            else:
                dist.all_reduce(x, group=g)
        elif kind == "shape":
            dist.all_reduce(distgrad.ones(5) if ctx.rank == 1 else x, group=g)
        elif kind == "dtype":
            dist.all_reduce(distgrad.ones(4, dtype=distgrad.float64) if ctx.rank == 2 else x,
                            group=g)
        elif kind == "root":
            dist.broadcast(x, src=1 if ctx.rank == 0 else 0, group=g)
        elif kind == "order":
            if ctx.rank == 0:
                dist.all_reduce(x, group=g)
                dist.broadcast(x, src=0, group=g)
            else:
                dist.broadcast(x, src=0, group=g)
                dist.all_reduce(x, group=g)
        else:
            raise ValueError(kind)
    except dist.DistBackendError as e:
        t0 = time.monotonic()
        try:  # the group is broken from now on: a later call fails at once
            dist.all_reduce(x, group=g)
        except dist.DistBackendError as again:
            assert str(again) == str(e)
        else:
            raise AssertionError("a broken group ran a collective")
        assert time.monotonic() - t0 < 1
        return str(e)
    raise AssertionError("the mismatch went unnoticed")


@case
def timeout(ctx):
    g = dist.new_group(list(range(ctx.n)), timeout=0.5)
    if ctx.rank == 1:
        return "skipped"
    t0 = time.monotonic()
    try:
        dist.all_reduce(distgrad.ones(3), group=g)
    except dist.DistBackendError as e:
        return [str(e), time.monotonic() - t0]
    raise AssertionError("no timeout")


@case
def send_then_leave(ctx, receiver, leaver):
    """``leaver`` sends and leaves at once; what it sent can still be received."""
    if ctx.rank == leaver:
        dist.send(distgrad.tensor([1.0, 2.0]), receiver)
        dist.destroy_process_group()
        return True
    time.sleep(0.3)  # the message and the departure are both in by now
    t = distgrad.zeros(2)
    assert dist.recv(t, leaver) == leaver and t.tolist() == [1.0, 2.0]
    try:
        dist.recv(t, leaver)
    except dist.DistBackendError as e:
        assert f"rank {leaver} left" in str(e), str(e)
        return True
    raise AssertionError("a second recv from a departed rank succeeded")


@case
def die_during_all_reduce(ctx, k, victim):
    """``victim`` starts a large all-reduce in the group of the first ``k`` ranks and is
    killed in the middle of it."""
    g = ctx.groups[k]
    x = distgrad.ones(4_000_000)
    if ctx.rank == victim:
        dist.all_reduce(x, group=g, async_op=True)
        time.sleep(0.01)
        os.kill(os.getpid(), signal.SIGKILL)
    t0 = time.monotonic()
    try:
        for _ in range(50):
            dist.all_reduce(x, group=g)
    except dist.DistBackendError as e:
        return [str(e), time.monotonic() - t0]
    raise AssertionError("the victim's death went unnoticed")

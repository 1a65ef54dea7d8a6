"""Benchmark: the RPC pipeline of pytorch/examples (``distributed/rpc/pipeline``), import swapped.

Two stages, each a shard of an MLP held by an RRef on its own worker (``rpc.remote``);
the coordinator cuts every batch into micro-batches, sends each through the stages
with ``RRef.remote()`` / ``rpc_async()`` (stage 2 fetches stage 1's output with
``to_here()``, as the example does), runs one ``dist_autograd.backward`` per step
and steps a ``DistributedOptimizer`` (SGD). The model: 8 layers of Linear(1024, 1024)
+ ReLU, 4 per stage, batch 256, one BLAS thread per process. The same program runs
on PyTorch (``torch``) and on distgrad (``import distgrad as torch``), against the
same model trained in one process with one BLAS thread (the floor each framework
has to beat). Prints samples/s and the ratio to one process per micro-batch count,
then one JSON line. The unchanged program on distgrad defers its linear weights'
gradients to the end of each worker's part of the backward (distributed autograd does
that by itself); the row ``distgrad+eager`` turns that off
(``DISTGRAD_DEFER_WEIGHT_GRADS=0``), to show what it brings. A row ``distgrad+defer``
is the program with three lines added (each shard defers its linear weights' gradients
over the whole step and the loop flushes them before the optimizer step, as
``distgrad launch`` does), against its one process doing the same.

Targets (issue "Small messages at PyTorch's speed"): the unchanged program's ratio to
its one process at least PyTorch's at every micro-batch count, and at least 1.0x with
4 micro-batches.

    python scripts/bench_rpc_pipeline.py [--quick] [--no-torch] [--micro 1 2 4 8]
"""
import argparse
import contextlib
import importlib
import json
import multiprocessing as mp
import os
import queue
import statistics
import sys
import threading
import time

# One BLAS thread per process, set before NumPy or torch load (both sides alike).
for _v in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[_v] = "1"

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

DIM, LAYERS, BATCH, CLASSES = 1024, 8, 256, 16
# The framework of this process, chosen by the parent before it spawns (the classes below
# derive from its nn.Module, and workers resolve them by name in this module).
FRAMEWORK_ENV = "BENCH_RPC_PIPELINE_FRAMEWORK"
FRAMEWORK = os.environ.get(FRAMEWORK_ENV, "distgrad")
T = importlib.import_module(FRAMEWORK)
for _sub in ("distributed.rpc", "distributed.autograd", "distributed.optim", "futures"):
    importlib.import_module(f"{FRAMEWORK}.{_sub}")  # as the example's imports do
if FRAMEWORK == "torch":
    T.set_num_threads(1)
# The variant "distgrad+defer": the same program with three lines added, each shard
# deferring its linear weights' gradients (distgrad.autograd.defer_weight_grads) and the
# loop flushing them before the optimizer step, as `distgrad launch` does.
DEFER_ENV = "BENCH_RPC_PIPELINE_DEFER"
DEFER = os.environ.get(DEFER_ENV) == "1"


def _layers(n, head=False):
    mods = []
    for _ in range(n):
        mods += [T.nn.Linear(DIM, DIM), T.nn.ReLU()]
    if head:
        mods.append(T.nn.Linear(DIM, CLASSES))
    return mods


# ---------------------------------------------------------------------- the example's shape
class Shard(T.nn.Module):
    """One stage: a slice of the layers (the example's ResNetShard1/2)."""

    def __init__(self, index):
        super().__init__()
        T.manual_seed(index)
        self.seq = T.nn.Sequential(*_layers(LAYERS // 2, head=index == 1))
        self._lock = threading.Lock()
        if DEFER:  # added line 1 of 3
            self.deferred = T.autograd.defer_weight_grads(list(self.parameters())).activate()

    def forward(self, x_rref):
        x = x_rref.to_here()
        with self._lock:
            out = self.seq(x)
        return out

    def parameter_rrefs(self):
        return [T.distributed.rpc.RRef(p) for p in self.parameters()]

    def flush(self):  # added line 2 of 3
        self.deferred.flush()


class DistNet:
    """The example's DistResNet50: micro-batches through two remote shards."""

    def __init__(self, split_size, workers):
        rpc = T.distributed.rpc
        self.split_size = split_size
        self.p1_rref = rpc.remote(workers[0], Shard, args=(0,))
        self.p2_rref = rpc.remote(workers[1], Shard, args=(1,))

    def __call__(self, xs):
        rpc = T.distributed.rpc
        out_futures = []
        for x in iter(xs.split(self.split_size, dim=0)):
            x_rref = rpc.RRef(x)
            y_rref = self.p1_rref.remote().forward(x_rref)
            z_fut = self.p2_rref.rpc_async().forward(y_rref)
            out_futures.append(z_fut)
        return T.cat(T.futures.wait_all(out_futures))

    def parameter_rrefs(self):
        return (self.p1_rref.remote().parameter_rrefs().to_here()
                + self.p2_rref.remote().parameter_rrefs().to_here())


# ---------------------------------------------------------------------- processes
def _worker(rank, port, allowed):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    rpc = T.distributed.rpc
    opts = rpc.TensorPipeRpcBackendOptions(rpc_timeout=300)
    if FRAMEWORK != "torch":
        opts.allowed_modules = allowed
    rpc.init_rpc(f"worker{rank}", rank=rank, world_size=3, rpc_backend_options=opts)
    rpc.shutdown()


def _data():
    T.manual_seed(0)
    return T.randn(BATCH, DIM), T.randint(0, CLASSES, (BATCH,))


def _rate(times, warmup):
    """Median samples/s over three windows of the steps after ``warmup``."""
    times = times[warmup:]
    n = len(times) - 1
    edges = [round(i * n / 3) for i in range(4)]
    return statistics.median(BATCH * (b - a) / (times[b] - times[a])
                             for a, b in zip(edges[:-1], edges[1:]))


def one_process(micro_list, steps, warmup, out):
    """The floor: the same model and step in one process, one BLAS thread, on the whole
    batch; then on the same micro-batches one after the other (gradients accumulated),
    which is the compute a pipeline of those micro-batches has to spread over its stages:
    small matrix products run below the BLAS's speed on large ones."""
    T.manual_seed(0)
    model = T.nn.Sequential(*_layers(LAYERS // 2), *_layers(LAYERS // 2, head=True))
    opt = T.optim.SGD(model.parameters(), lr=0.05)
    loss_fn = T.nn.CrossEntropyLoss()
    x, y = _data()
    rates = {}
    for micro in [1] + [m for m in micro_list if m != 1]:
        xs, ys = x.split(BATCH // micro), y.split(BATCH // micro)
        times = []
        deferred = T.autograd.defer_weight_grads(list(model.parameters())) if DEFER \
            else contextlib.nullcontext()
        for _ in range(steps):
            opt.zero_grad()
            with deferred:
                for xm, ym in zip(xs, ys):
                    (loss_fn(model(xm), ym) / micro).backward()
            opt.step()
            times.append(time.perf_counter())
        rates[micro] = _rate(times, warmup)
    out.put(rates)


def pipeline(micro_list, steps, warmup, out):
    """The example's training loop, once per micro-batch count, in one world."""
    from distgrad.utils.ports import free_port
    port = free_port()
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    allowed = [__name__]
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=_worker, args=(r, port, allowed), daemon=True)
             for r in (1, 2)]
    for p in procs:
        p.start()
    rpc = T.distributed.rpc
    dist_autograd = T.distributed.autograd
    opts = rpc.TensorPipeRpcBackendOptions(rpc_timeout=300)
    if FRAMEWORK != "torch":
        opts.allowed_modules = allowed
    rpc.init_rpc("master", rank=0, world_size=3, rpc_backend_options=opts)
    results = {}
    try:
        x, y = _data()
        loss_fn = T.nn.CrossEntropyLoss()
        for micro in micro_list:
            model = DistNet(BATCH // micro, ["worker1", "worker2"])
            opt = T.distributed.optim.DistributedOptimizer(
                T.optim.SGD, model.parameter_rrefs(), lr=0.05)
            times = []
            for _ in range(steps):
                with dist_autograd.context() as context_id:
                    outputs = model(x)
                    dist_autograd.backward(context_id, [loss_fn(outputs, y)])
                    if DEFER:  # added line 3 of 3
                        T.futures.wait_all([s.rpc_async().flush()
                                            for s in (model.p1_rref, model.p2_rref)])
                    opt.step(context_id)
                times.append(time.perf_counter())
            results[micro] = _rate(times, warmup)
            del model, opt
    finally:
        rpc.shutdown()
        for p in procs:
            p.join(60)
            if p.is_alive():
                p.kill()
    out.put(results)


def _in_child(variant, fn, *args):
    """Run ``fn`` in a fresh spawned process of ``variant`` ("torch", "distgrad",
    "distgrad+eager" or "distgrad+defer"; each run alone in its own)."""
    framework, _, option = variant.partition("+")
    os.environ[FRAMEWORK_ENV] = framework
    os.environ[DEFER_ENV] = "1" if option == "defer" else "0"
    os.environ["DISTGRAD_DEFER_WEIGHT_GRADS"] = "0" if option == "eager" else "1"
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    p = ctx.Process(target=fn, args=(*args, q))
    p.start()
    try:
        while True:
            try:
                return q.get(timeout=1.0)
            except queue.Empty:
                if not p.is_alive():
                    raise RuntimeError(f"{fn.__name__} on {framework} failed (exit code "
                                       f"{p.exitcode}); its error is above") from None
    finally:
        p.join(60)
        if p.is_alive():
            p.kill()


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer steps (a smoke test)")
    ap.add_argument("--no-torch", action="store_true", help="distgrad only")
    ap.add_argument("--micro", type=int, nargs="+", default=[1, 2, 4, 8])
    ap.add_argument("--rounds", type=int, default=3, help="repetitions; medians reported")
    args = ap.parse_args()
    steps, warmup = (12, 3) if args.quick else (30, 5)
    frameworks = ["distgrad", "distgrad+eager", "distgrad+defer"]
    if not args.no_torch:
        try:
            importlib.import_module("torch")
            frameworks.append("torch")
        except ImportError:
            pass
    rates = {f: {"single": [], **{m: [] for m in args.micro}} for f in frameworks}
    sequential = {f: {m: [] for m in args.micro} for f in frameworks}
    for _ in range(args.rounds):  # rounds alternate, so a burst of load hits all alike
        for f in frameworks:
            alone = _in_child(f, one_process, args.micro, steps, warmup)
            rates[f]["single"].append(alone[1])
            for m in args.micro:
                sequential[f][m].append(alone[m])
            for m, r in _in_child(f, pipeline, args.micro, steps, warmup).items():
                rates[f][m].append(r)
            print(f"# {f}: one process {rates[f]['single'][-1]:.0f} samples/s, pipeline "
                  + ", ".join(f"{m}: {rates[f][m][-1]:.0f}" for m in args.micro),
                  file=sys.stderr, flush=True)
    med = {f: {k: statistics.median(v) for k, v in r.items()} for f, r in rates.items()}
    # distgrad's variants train the whole batch in one process alike (deferring one part
    # makes the same product, only later): one floor for both, the median of their runs
    own_single = {f: med[f]["single"] for f in frameworks}  # the split rows' floor
    ours = [f for f in frameworks if f.startswith("distgrad")]
    pooled = statistics.median([r for f in ours for r in rates[f]["single"]])
    for f in ours:
        med[f]["single"] = pooled
    seq = {f: {m: statistics.median(v) for m, v in r.items()} for f, r in sequential.items()}
    print(f"RPC pipeline (pytorch/examples shape): 2 stages x {LAYERS // 2} layers of {DIM}, "
          f"batch {BATCH}, one BLAS thread per process; samples/s, medians of {args.rounds}")
    header = f"{'micro-batches':<28}" + "".join(f"{m:>10}" for m in args.micro) + f"{'1 process':>12}"
    print(header)
    result = {"bench": "rpc_pipeline", "micro_batches": args.micro, "frameworks": {}}
    for f in frameworks:
        single = med[f]["single"]
        ratios = {m: med[f][m] / single for m in args.micro}
        print(f"{f + ' samples/s':<28}" + "".join(f"{med[f][m]:10.0f}" for m in args.micro)
              + f"{single:12.0f}")
        print(f"{f + ' ratio':<28}" + "".join(f"{ratios[m]:9.2f}x" for m in args.micro)
              + f"{'1.00x':>12}")
        # the same micro-batches one after another in one process: what splitting costs
        print(f"{f + ' 1 proc split':<28}" + "".join(f"{seq[f][m] / own_single[f]:9.2f}x"
                                                     for m in args.micro))
        result["frameworks"][f] = {"single": single, "rates": {str(m): med[f][m]
                                                               for m in args.micro},
                                   "ratios": {str(m): ratios[m] for m in args.micro},
                                   "one_process_split": {str(m): seq[f][m] / own_single[f]
                                                         for m in args.micro}}
    dg = result["frameworks"]["distgrad"]["ratios"]
    theirs = result["frameworks"].get("torch", {}).get("ratios", {})
    ok = dg.get("4", 0) >= 1.0 and all(dg[m] >= theirs.get(m, 0) for m in dg)
    result["targets_met"] = bool(ok)
    print(json.dumps(result))


if __name__ == "__main__":
    import perf_page
    # run as the module "bench_rpc_pipeline", so that workers (and pickle, for PyTorch)
    # find Shard and the process targets under that name
    import bench_rpc_pipeline
    with perf_page.recorded("bench_rpc_pipeline"):  # with --record: its section of docs/performance.md
        bench_rpc_pipeline.main()

"""Benchmark: distgrad's collectives and DDP against torch.distributed (gloo), in one run.

1. ``all_reduce`` of float32 tensors of 4 KB, 1 MB, 16 MB and 64 MB with 2 and 3
   local ranks: the median time per call (over repetitions, after a warm-up) and
   the algorithm bandwidth (bytes / time), for distgrad and for torch's gloo.
   Targets: at least gloo's bandwidth from 1 MB on, at most 1.5x its latency at 4 KB.
2. A DDP step of an MLP (width 1024, 8 layers, batch 256) on 2 ranks against the
   same step with the all-reduce left out (``no_sync``), alternating: at most 1.15x
   (the median over each step's ratio to its neighbour), which only overlapping the
   all-reduce with backward achieves. torch's DDP step is shown beside it.

Every process runs NumPy/torch on one thread (2 ranks = 2 cores). The all-reduce
worlds run ``--rounds`` times (default 2), distgrad and gloo alternating, and each
size reports the lower of the rounds' medians, for both alike: on a machine shared
with other work one round can land in a burst of load (every round's medians are in
the JSON line). Prints a table and one JSON line; ``--quick`` runs fewer repetitions.

    python scripts/bench_collectives.py [--quick] [--no-torch] [--rounds N]
"""
import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[var] = "1"  # before NumPy loads, here and (inherited) in the children

from distgrad.utils.ports import free_port  # noqa: E402

SIZES = (4 << 10, 1 << 20, 16 << 20, 64 << 20)
WORLDS = (2, 3)


def _reps(nbytes, quick):
    base = 300 if nbytes <= 4096 else 30 if nbytes <= 1 << 20 else 8 if nbytes <= 16 << 20 else 5
    return max(3, base // 3) if quick else base


def _time_all_reduce(lib, dist, rank, quick):
    """{bytes: median seconds per all_reduce} measured on this rank."""
    out = {}
    for nbytes in SIZES:
        t = lib.ones(nbytes // 4)
        for _ in range(3):
            dist.all_reduce(t)
        dist.barrier()
        times = []
        for _ in range(_reps(nbytes, quick)):
            t0 = time.perf_counter()
            dist.all_reduce(t)
            times.append(time.perf_counter() - t0)
        times.sort()
        out[nbytes] = times[len(times) // 2]
    return out


def _join(which, rank, world, port):
    """(library, its distributed package) after joining the world (torch: one thread)."""
    if which == "torch":
        import torch as lib
        import torch.distributed as dist
        lib.set_num_threads(1)
    else:
        import distgrad as lib
        import distgrad.distributed as dist
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world)
    return lib, dist


def _collectives_worker(rank, world, port, which, outdir, quick):
    lib, dist = _join(which, rank, world, port)
    result = _time_all_reduce(lib, dist, rank, quick)
    if rank == 0:
        Path(outdir, f"{which}-{world}.json").write_text(json.dumps(result))
    dist.barrier()
    dist.destroy_process_group()


# ---------------------------------------------------------------------- DDP
WIDTH, LAYERS, BATCH = 1024, 8, 256


def _mlp(nn):
    layers = []
    for _ in range(LAYERS - 1):
        layers += [nn.Linear(WIDTH, WIDTH), nn.ReLU()]
    layers.append(nn.Linear(WIDTH, WIDTH))
    return nn.Sequential(*layers)


def _ddp_worker(rank, world, port, which, outdir, quick):
    import contextlib
    lib, dist = _join(which, rank, world, port)
    lib.manual_seed(0)
    model = lib.nn.parallel.DistributedDataParallel(_mlp(lib.nn))
    opt = lib.optim.SGD(model.parameters(), lr=1e-4)
    x = lib.randn(BATCH, WIDTH)
    y = lib.randn(BATCH, WIDTH)

    def step(sync):
        opt.zero_grad()
        with (contextlib.nullcontext() if sync else model.no_sync()):
            loss = ((model(x) - y) ** 2).mean()
            loss.backward()
        opt.step()

    reps = 4 if quick else 16
    times = {True: [], False: []}
    for _ in range(2):
        step(True)
        step(False)
    for i in range(reps):  # alternate, so drift in the machine's load hits both alike
        for sync in ((True, False) if i % 2 == 0 else (False, True)):
            dist.barrier()
            t0 = time.perf_counter()
            step(sync)
            times[sync].append(time.perf_counter() - t0)
    if rank == 0:
        med = {("ddp" if k else "no_sync"): sorted(v)[len(v) // 2] for k, v in times.items()}
        # each step against its neighbour of the other kind: load that drifts over the
        # run cancels out of the ratio
        pairs = sorted(a / b for a, b in zip(times[True], times[False]))
        med["paired_ratio"] = pairs[len(pairs) // 2]
        Path(outdir, f"ddp-{which}.json").write_text(json.dumps(med))
    dist.barrier()
    dist.destroy_process_group()


def _run(fn, world, which, outdir, quick):
    import distgrad.multiprocessing as mp
    mp.spawn(fn, args=(world, free_port(), which, outdir, quick), nprocs=world)


def _load(outdir, name):
    p = Path(outdir, name)
    return json.loads(p.read_text()) if p.exists() else None


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--no-torch", action="store_true")
    ap.add_argument("--skip-ddp", action="store_true")
    ap.add_argument("--skip-collectives", action="store_true")
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    have_torch = not args.no_torch
    if have_torch:
        try:
            import torch  # noqa: F401
        except ImportError:
            have_torch = False
    load = os.getloadavg()[0]
    result = {"load_before": round(load, 2), "all_reduce": {}, "ddp": {}}
    with tempfile.TemporaryDirectory() as outdir:
        worlds = () if args.skip_collectives else WORLDS
        libs = ["distgrad", "torch"] if have_torch else ["distgrad"]
        rounds = {}  # (lib, world) -> [{bytes: median}] per round
        for k in range(max(1, args.rounds)):
            for world in worlds:
                for which in (libs if k % 2 == 0 else libs[::-1]):
                    _run(_collectives_worker, world, which, outdir, args.quick)
                    rounds.setdefault((which, world), []).append(
                        _load(outdir, f"{which}-{world}.json"))
        if not args.skip_ddp:
            for which in (["distgrad", "torch"] if have_torch else ["distgrad"]):
                _run(_ddp_worker, 2, which, outdir, args.quick)
        print(f"all_reduce, float32, local ranks (load average {load:.2f} on "
              f"{os.cpu_count()} cores)")
        print(f"{'ranks':>5}{'size':>8}{'distgrad ms':>13}{'GB/s':>7}{'gloo ms':>10}{'GB/s':>7}"
              f"{'dg/gloo time':>14}")
        def best(which, world, nbytes):
            runs = rounds.get((which, world))
            return min(r[str(nbytes)] for r in runs) if runs else None

        for world in worlds:
            for nbytes in SIZES:
                d = best("distgrad", world, nbytes)
                g = best("torch", world, nbytes)
                size = f"{nbytes >> 20} MB" if nbytes >= 1 << 20 else f"{nbytes >> 10} KB"
                row = f"{world:>5}{size:>8}{d * 1e3:13.3f}{nbytes / d / 1e9:7.2f}"
                if g:
                    row += f"{g * 1e3:10.3f}{nbytes / g / 1e9:7.2f}{d / g:14.2f}"
                print(row)
                result["all_reduce"][f"{world}x{nbytes}"] = {
                    "distgrad_s": d, "gloo_s": g, "ratio": d / g if g else None,
                    "rounds": {w: [r[str(nbytes)] for r in rounds.get((w, world), [])]
                               for w in libs}}
        if not args.skip_ddp:
            ours = _load(outdir, "ddp-distgrad.json")
            theirs = _load(outdir, "ddp-torch.json") if have_torch else None
            print(f"\nDDP step, MLP {LAYERS}x{WIDTH}, batch {BATCH}, 2 ranks (ratio: median of "
                  "each step over its neighbouring step without the all-reduce)")
            print(f"{'':>10}{'ddp ms':>10}{'no all-reduce ms':>18}{'ratio':>8}")
            for name, r in (("distgrad", ours), ("torch", theirs)):
                if r is None:
                    continue
                print(f"{name:>10}{r['ddp'] * 1e3:10.1f}{r['no_sync'] * 1e3:18.1f}"
                      f"{r['paired_ratio']:8.3f}")
                result["ddp"][name] = dict(r, ratio=r["paired_ratio"])
    result["load_after"] = round(os.getloadavg()[0], 2)
    print(json.dumps(result))


if __name__ == "__main__":
    import perf_page
    with perf_page.recorded("bench_collectives"):  # with --record: its section of docs/performance.md
        main()

"""Benchmark: a distributed training step against the same model in one process.

A two-stage MLP pipeline: stage one (4 Linear+tanh layers) lives on worker1 as a
RemoteModule, stage two (4 Linear+tanh layers and a squared loss) on the
coordinator; one step = forward through both stages, distributed backward,
DistributedOptimizer(SGD).step, context release. The floor is the same model and
step in one process (and the raw pyzmq round trip, for the added time), all
measured in the same run; ``torch.distributed.autograd`` runs the same pipeline
when PyTorch is installed.

It also counts what one step sends, in messages and bytes (both processes; arrays
that travel through shared memory count as their reference). The minimum for this
shape is 6 messages: forward, the input to worker1 and its output back; backward,
the output's gradient (which also starts worker1's part) and worker1's completion;
the optimizer step on worker1 and its answer. Releasing the context rides along on
the next step's first message.

None of the three requests is served on its receiver's I/O thread (``never_blocks``, see
``rpc/PROTOCOL.md``): each runs a module's forward, a backward pass or an optimizer step,
so each costs a hand-off to a handler thread there, and its reply one to the waiting
thread (2 thread hand-offs a round trip, as for any user function).

Targets: added time at B32-D64 at most 8 raw pyzmq round trips; at B256-D512 at most
1.05x the one-process step and a smaller ratio than PyTorch's in the same run.

    python scripts/bench_dist.py [--quick] [--no-torch]
"""
import argparse
import json
import multiprocessing as mp
import os
import sys
from pathlib import Path

# One BLAS thread per process: with two processes on the same cores, OpenBLAS threads
# spinning in one process steal the CPU the other one computes on (both sides alike).
for _v in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_v, "1")

import numpy as np  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

# The same floor, torch worker and interleaved timing as the RPC benchmark.
from bench_rpc import RawClient, _interleaved, _torch_worker  # noqa: E402
from distgrad.utils.ports import free_port  # noqa: E402

CONFIGS = ((32, 64), (256, 512))
LAYERS = 4


def _mlp(nn, d):
    from bench_remote import make_mlp
    return make_mlp(d, LAYERS)


# ---------------------------------------------------------------------- distgrad
def bench_distgrad(reps, batches):
    import distgrad
    from distgrad import nn
    from distgrad.distributed import autograd as dist_autograd
    from distgrad.distributed import rpc
    from distgrad.distributed.nn import RemoteModule
    from distgrad.distributed.optim import DistributedOptimizer
    from distgrad.testing.world import World
    from bench_remote import make_mlp, message_counts

    raw = RawClient()
    world = World(1, transport="tcp", num_worker_threads=4, allowed_modules=["bench_remote"]).start()
    out = {}
    try:
        small = np.ones(16, dtype=np.float32)
        out["raw_rt"] = _interleaved({"r": lambda: raw(small)}, 500, batches)["r"]
        for b, d in CONFIGS:
            rng = np.random.default_rng(0)
            x = distgrad.tensor(rng.standard_normal((b, d)).astype(np.float32))
            stage1 = RemoteModule("worker1", make_mlp, args=(d, LAYERS))
            stage2 = _mlp(nn, d)
            params = stage1.remote_parameters() + [rpc.RRef(p) for p in stage2.parameters()]
            dopt = DistributedOptimizer(distgrad.optim.SGD, params, lr=1e-3)
            local1, local2 = _mlp(nn, d), _mlp(nn, d)
            lopt = distgrad.optim.SGD(list(local1.parameters()) + list(local2.parameters()),
                                      lr=1e-3)

            def dist_step():
                with dist_autograd.context() as cid:
                    loss = (stage2(stage1(x)) ** 2).mean()
                    dist_autograd.backward(cid, [loss])
                    dopt.step(cid)

            def local_step():
                lopt.zero_grad()
                loss = (local2(local1(x)) ** 2).mean()
                loss.backward()
                lopt.step()
            for _ in range(20):
                dist_step(), local_step()
            r = max(3, reps // (1 if d < 256 else 10))
            res = _interleaved({"dist": dist_step, "local": local_step}, r, batches)
            res["messages"], res["bytes"] = _per_step(dist_step, message_counts, rpc)
            out[(b, d)] = res
        return out
    finally:
        world.close()
        raw.close()


def _per_step(step, counts, rpc, steps=20):
    """Messages and bytes one step sends, both processes together."""
    import time
    step()
    time.sleep(0.3)  # notices of the warm-up step leave (they ride along, or after 100 ms)

    def total():
        mine = counts()
        theirs = rpc.rpc_sync("worker1", counts)
        return mine[0] + theirs[0], mine[1] + theirs[1]
    m0, b0 = total()
    for _ in range(steps):
        step()
    m1, b1 = total()
    # between the two readings: the first reading's reply and the second one's request
    # are not the steps' (their bytes are a few dozen)
    return (m1 - m0 - 2) / steps, (b1 - b0) / steps


# ---------------------------------------------------------------------- PyTorch
_TORCH_STAGE = None


def _torch_make_stage(d):
    import torch
    global _TORCH_STAGE
    torch.manual_seed(0)
    mods = []
    for _ in range(LAYERS):
        mods += [torch.nn.Linear(d, d), torch.nn.Tanh()]
    _TORCH_STAGE = torch.nn.Sequential(*mods)
    from torch.distributed.rpc import RRef
    return [RRef(p) for p in _TORCH_STAGE.parameters()]


def _torch_forward(x):
    return _TORCH_STAGE(x)


def bench_torch(reps, batches):
    try:
        import torch
        import torch.distributed.autograd as tda
        import torch.distributed.rpc as trpc
        from torch.distributed.optim import DistributedOptimizer
    except ImportError:
        return None
    torch.set_num_threads(1)
    port = free_port()
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    p = mp.get_context("spawn").Process(target=_torch_worker, args=(port,), daemon=True)
    p.start()
    trpc.init_rpc("worker0", rank=0, world_size=2)
    out = {}
    try:
        for b, d in CONFIGS:
            x = torch.randn(b, d)
            prefs = trpc.rpc_sync("worker1", _torch_make_stage, (d,))
            stage2 = torch.nn.Sequential(*[m for _ in range(LAYERS)
                                           for m in (torch.nn.Linear(d, d), torch.nn.Tanh())])
            dopt = DistributedOptimizer(torch.optim.SGD,
                                        prefs + [trpc.RRef(q) for q in stage2.parameters()],
                                        lr=1e-3)
            local1 = torch.nn.Sequential(*[m for _ in range(LAYERS)
                                           for m in (torch.nn.Linear(d, d), torch.nn.Tanh())])
            local2 = torch.nn.Sequential(*[m for _ in range(LAYERS)
                                           for m in (torch.nn.Linear(d, d), torch.nn.Tanh())])
            lopt = torch.optim.SGD(list(local1.parameters()) + list(local2.parameters()), lr=1e-3)

            def dist_step():
                with tda.context() as cid:
                    h = trpc.rpc_sync("worker1", _torch_forward, (x,))
                    loss = (stage2(h) ** 2).mean()
                    tda.backward(cid, [loss])
                    dopt.step(cid)

            def local_step():
                lopt.zero_grad()
                (local2(local1(x)) ** 2).mean().backward()
                lopt.step()
            for _ in range(20):
                dist_step(), local_step()
            r = max(3, reps // (1 if d < 256 else 10))
            out[(b, d)] = _interleaved({"dist": dist_step, "local": local_step}, r, batches)
        return out
    finally:
        trpc.shutdown()
        p.join(30)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--no-torch", action="store_true")
    args = ap.parse_args()
    reps, batches = (30, 5) if args.quick else (100, 9)
    dg = bench_distgrad(reps, batches)
    th = None if args.no_torch else bench_torch(reps, batches)
    rt = dg["raw_rt"]
    print(f"raw pyzmq round trip: {rt * 1e6:.1f} us")
    print(f"{'config':<12}{'local ms':>10}{'dist ms':>10}{'added ms':>10}{'added/RT':>10}"
          f"{'ratio':>8}{'msgs':>6}{'KB':>8}{'torch local':>13}{'torch dist':>12}"
          f"{'torch added':>13}{'t ratio':>9}")
    result = {"bench": "dist", "raw_rt_us": rt * 1e6, "configs": {}}
    ok = True
    for b, d in CONFIGS:
        r = dg[(b, d)]
        added = r["dist"] - r["local"]
        ratio = r["dist"] / r["local"]
        t = th[(b, d)] if th else None
        t_added = t["dist"] - t["local"] if t else None
        t_ratio = t["dist"] / t["local"] if t else None
        ts = (f"{t['local'] * 1e3:13.3f}{t['dist'] * 1e3:12.3f}{t_added * 1e3:13.3f}{t_ratio:9.2f}"
              if t else f"{'n/a':>13}{'n/a':>12}{'n/a':>13}{'n/a':>9}")
        print(f"B{b}-D{d:<7}{r['local'] * 1e3:10.3f}{r['dist'] * 1e3:10.3f}{added * 1e3:10.3f}"
              f"{added / rt:10.1f}{ratio:8.3f}{r['messages']:6.1f}{r['bytes'] / 1024:8.1f}{ts}")
        key = f"B{b}-D{d}"
        result["configs"][key] = {"local_ms": r["local"] * 1e3, "dist_ms": r["dist"] * 1e3,
                                  "added_ms": added * 1e3, "added_round_trips": added / rt,
                                  "ratio": ratio, "messages_per_step": r["messages"],
                                  "bytes_per_step": r["bytes"],
                                  "torch_local_ms": t["local"] * 1e3 if t else None,
                                  "torch_dist_ms": t["dist"] * 1e3 if t else None,
                                  "torch_added_ms": t_added * 1e3 if t else None,
                                  "torch_ratio": t_ratio}
        if d < 256:
            ok = ok and added / rt <= 8
        else:
            ok = ok and ratio <= 1.05 and (t is None or ratio < t_ratio)
    result["targets_met"] = bool(ok)
    print(json.dumps(result))


if __name__ == "__main__":
    import perf_page
    with perf_page.recorded("bench_dist"):  # with --record: its section of docs/performance.md
        main()

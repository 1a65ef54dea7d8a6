"""Soak: distributed training steps for minutes; is the fifth minute as fast as the first?

Two workers hold the two stages of an MLP (RemoteModule); this process drives
forward, distributed backward and DistributedOptimizer steps, one autograd
context per step. Every minute it prints steps/s and, for each process, RSS,
threads and open file descriptors; at the end a table and one JSON line.
Passes when steps/s in every minute is within 10% of the first minute's and no
process grew by more than 10 threads, 20 fds or 50 MB of RSS after the first
minute.

With ``--forger``, a third worker is a forging peer all along: it sends every other
process what issue 22's attacker sent, claiming other ranks (a member forging) and
without credentials (an outsider); none of it may be served, and the members' figures
must stay flat as without it.

    python scripts/soak.py [--minutes 5] [--width 128] [--batch 64] [--forger]
"""
import argparse
import json
import os
import sys
import time
from pathlib import Path

for _v in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_v, "1")

sys.path.insert(0, str(Path(__file__).resolve().parent))

import numpy as np  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--minutes", type=float, default=5.0)
    ap.add_argument("--width", type=int, default=128)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--period", type=float, default=60.0, help="seconds per reported period")
    ap.add_argument("--forger", action="store_true",
                    help="a third worker forges messages to the others all along")
    args = ap.parse_args()

    import distgrad
    from distgrad.distributed import autograd as dist_autograd
    from distgrad.distributed import rpc
    from distgrad.distributed.nn import RemoteModule
    from distgrad.distributed.optim import DistributedOptimizer
    from distgrad.testing.world import World
    from bench_remote import make_mlp, process_stats

    world = World(3 if args.forger else 2, transport="tcp",
                  allowed_modules=["bench_remote"]).start()
    forging = None
    try:
        if args.forger:  # worker3 forges until the soak ends (and a little longer)
            forging = rpc.rpc_async("worker3", "bench_remote:forge_for",
                                    (args.minutes * 60 + 5, [0, 1, 2]),
                                    timeout=args.minutes * 60 + 60)
        d = args.width
        stage1 = RemoteModule("worker1", make_mlp, args=(d, 2))
        stage2 = RemoteModule("worker2", make_mlp, args=(d, 2))
        opt = DistributedOptimizer(distgrad.optim.SGD, stage1.remote_parameters()
                                   + stage2.remote_parameters(), lr=1e-3)
        x = distgrad.tensor(np.random.default_rng(0).standard_normal((args.batch, d))
                            .astype(np.float32))

        def stats():
            out = {"worker0": process_stats()}
            for w in ("worker1", "worker2"):
                out[w] = rpc.rpc_sync(w, process_stats)
            return out

        rows, end = [], time.monotonic() + args.minutes * 60
        print(f"{'minute':>6} {'steps/s':>9}  " + "  ".join(
            f"{w + ' rss/thr/fd':>22}" for w in ("worker0", "worker1", "worker2")), flush=True)
        period = 0
        while time.monotonic() < end:
            period += 1
            steps, t0 = 0, time.monotonic()
            while time.monotonic() - t0 < args.period and time.monotonic() < end:
                with dist_autograd.context() as cid:
                    loss = (stage2(stage1(x)) ** 2).mean()
                    dist_autograd.backward(cid, [loss])
                    opt.step(cid)
                steps += 1
            rate = steps / (time.monotonic() - t0)
            s = stats()
            rows.append({"period": period, "steps_per_s": rate, "stats": s})
            print(f"{period:>6} {rate:>9.1f}  " + "  ".join(
                f"{v[0]:>10.1f}MB {v[1]:>3} {v[2]:>4}" for v in s.values()), flush=True)
        first = rows[0]
        worst = min(r["steps_per_s"] for r in rows) / first["steps_per_s"]
        growth = {w: [rows[-1]["stats"][w][i] - first["stats"][w][i] for i in range(3)]
                  for w in first["stats"]}
        ok = worst >= 0.9 and all(g[0] <= 50 and g[1] <= 10 and g[2] <= 20
                                  for g in growth.values())
        forged = forging.wait() if forging is not None else None
        if forged is not None:
            print(f"forging peer: {forged['sent']} messages sent ({forged['unsent']} more found "
                  f"no connection), {forged['refused']} refused with an answer, "
                  f"{forged['served']} served")
            ok = ok and forged["served"] == 0
        print(json.dumps({"bench": "soak", "minutes": args.minutes, "periods": rows,
                          "slowest_vs_first": worst, "growth_rss_threads_fds": growth,
                          "forger": forged, "targets_met": ok}))
    finally:
        world.close()


if __name__ == "__main__":
    main()

"""Soak: distributed training steps for minutes or an hour; does the last period run as
fast as the first, in as much memory?

Two workers hold the two stages of an MLP (RemoteModule); this process drives
forward, distributed backward and DistributedOptimizer steps, one autograd
context per step. Every period (a minute by default) it prints steps/s, the load
average of the machine and, for each process, RSS, threads and open file
descriptors; at the end a table and one JSON line. The first period is the warm-up:
the targets are met when steps/s in every later period is within 10% of the first
period's, and no process grew after it by more than ``--flat-mb`` (5) MB of RSS, 2
threads or 4 fds (at the highest figure of any later period, not only the last).

With ``--forger``, a third worker is a forging peer all along: it sends every other
process what issue 22's attacker sent, claiming other ranks (a member forging) and
without credentials (an outsider); none of it may be served, and the members' figures
must stay flat as without it.

With ``--trace N``, every process traces its allocations from the end of the first
period (tracemalloc, which slows the steps and adds memory of its own) and prints, at
the end, the N places whose live memory grew most and the object types whose counts
grew most: how a growth is found.

    python scripts/soak.py [--minutes 5] [--period 60] [--forger] [--trace 10]
    python scripts/soak.py --minutes 60 --period 600 --forger --record   # the hour
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

import perf_page  # noqa: E402

WORKERS = ("worker1", "worker2")
_traced = {}


def trace_start(frames=8):
    """Start tracing allocations in this process (the baseline of :func:`trace_growth`)."""
    import gc
    import tracemalloc
    tracemalloc.start(frames)
    gc.collect()
    _traced["start"] = (tracemalloc.take_snapshot(), _type_counts())
    return True


def _type_counts():
    import collections
    import gc
    return collections.Counter(type(o).__qualname__ for o in gc.get_objects())


def trace_growth(top=10):
    """Where live memory grew most since :func:`trace_start`, and which object types."""
    import gc
    import tracemalloc
    gc.collect()
    before, counts = _traced["start"]
    now = tracemalloc.take_snapshot()
    ignore = [tracemalloc.Filter(False, tracemalloc.__file__),
              tracemalloc.Filter(False, __file__)]
    lines = []
    for stat in now.filter_traces(ignore).compare_to(before.filter_traces(ignore),
                                                     "traceback")[:top]:
        if stat.size_diff <= 0:
            break
        where = " < ".join(f"{Path(f.filename).name}:{f.lineno}"  # newest frame first
                           for f in reversed(stat.traceback[-3:]))
        lines.append(f"{stat.size_diff / 1024:+9.1f} KiB {stat.count_diff:+7d} blocks  {where}")
    grown = _type_counts()
    grown.subtract(counts)
    lines.append("types: " + ", ".join(f"{t} {n:+d}" for t, n in grown.most_common(top)
                                       if n > 0))
    return lines


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--minutes", type=float, default=5.0)
    ap.add_argument("--width", type=int, default=128)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--period", type=float, default=60.0, help="seconds per reported period")
    ap.add_argument("--flat-mb", type=float, default=5.0,
                    help="RSS growth after the first period that still counts as flat")
    ap.add_argument("--forger", action="store_true",
                    help="a third worker forges messages to the others all along")
    ap.add_argument("--trace", type=int, default=0, metavar="N",
                    help="print the N places whose memory grew most after the first period")
    args = ap.parse_args()

    import distgrad
    from distgrad.distributed import autograd as dist_autograd
    from distgrad.distributed import rpc
    from distgrad.distributed.nn import RemoteModule
    from distgrad.distributed.optim import DistributedOptimizer
    from distgrad.testing.world import World
    from bench_remote import make_mlp, process_stats

    world = World(3 if args.forger else 2, transport="tcp",
                  allowed_modules=["bench_remote", "soak"]).start()
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
            for w in WORKERS:
                out[w] = rpc.rpc_sync(w, process_stats)
            return out

        rows, end = [], time.monotonic() + args.minutes * 60
        print(f"{'minute':>7} {'steps/s':>8} {'load':>5}  " + "  ".join(
            f"{w + ' MB/thr/fd':>20}" for w in ("worker0", *WORKERS)), flush=True)
        period, start = 0, time.monotonic()
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
            load = os.getloadavg()[0]
            rows.append({"period": period, "minute": (time.monotonic() - start) / 60,
                         "steps_per_s": rate, "load": load, "stats": s})
            print(f"{rows[-1]['minute']:>7.1f} {rate:>8.1f} {load:>5.1f}  " + "  ".join(
                f"{v[0]:>9.1f} {v[1]:>4} {v[2]:>4}" for v in s.values()), flush=True)
            if period == 1 and args.trace:
                trace_start()
                for w in WORKERS:
                    rpc.rpc_sync(w, "soak:trace_start")
        first, later = rows[0], rows[1:] or rows
        worst = min(r["steps_per_s"] for r in later) / first["steps_per_s"]
        growth = {w: [max(r["stats"][w][i] for r in later) - first["stats"][w][i]
                      for i in range(3)] for w in first["stats"]}
        ok = worst >= 0.9 and all(g[0] <= args.flat_mb and g[1] <= 2 and g[2] <= 4
                                  for g in growth.values())
        if args.trace:
            for w in ("worker0", *WORKERS):
                lines = trace_growth(args.trace) if w == "worker0" else \
                    rpc.rpc_sync(w, "soak:trace_growth", (args.trace,))
                print(f"{w}, allocations that grew after the first period:")
                print("\n".join("  " + line for line in lines))
        forged = forging.wait() if forging is not None else None
        if forged is not None:
            print(f"forging peer: {forged['sent']} messages sent ({forged['unsent']} more found "
                  f"no connection), {forged['refused']} refused with an answer, "
                  f"{forged['served']} served")
            ok = ok and forged["served"] == 0
        print(f"slowest period {worst:.2f}x the first's steps/s; growth after the first "
              "period (MB, threads, fds): " + ", ".join(
                  f"{w} {g[0]:+.1f} {g[1]:+d} {g[2]:+d}" for w, g in growth.items())
              + f"; targets {'met' if ok else 'NOT met'}")
        print(json.dumps({"bench": "soak", "minutes": args.minutes, "periods": rows,
                          "slowest_vs_first": worst, "growth_rss_threads_fds": growth,
                          "forger": forged, "targets_met": ok}))
        return 0 if ok else 1
    finally:
        world.close()


if __name__ == "__main__":
    with perf_page.recorded("soak"):
        sys.exit(main())

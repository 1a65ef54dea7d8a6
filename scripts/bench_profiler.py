"""Benchmark: the profiler's overhead on bench_engine's MLP step, beside PyTorch's.

For each shape of ``bench_engine.py``, in the same run and interleaved: hand-written
NumPy (the floor), the distgrad step, the same step inside ``distgrad.profiler.profile()``
(every op and backward node recorded), the step with the ops' profiler wrappers
bypassed (what the wrappers cost when nothing is profiled), and PyTorch's step without
and with ``torch.profiler.profile()`` when PyTorch is installed. A profile is open
around each round's steps (opening it, and building its results afterwards, are not
timed, for either library). Everything is timed twice: wall time, and the CPU time of
the thread (what the profiler costs the program, less exposed to other processes on a
loaded machine). Prints a table of medians and ratios and one JSON line.

    python scripts/bench_profiler.py            # all shapes
    python scripts/bench_profiler.py --quick    # fewer repetitions
"""
import argparse
import json
import os
import sys
import time

for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import numpy as np  # noqa: E402

import bench_engine as be  # noqa: E402
import distgrad  # noqa: E402
import distgrad.nn.functional as F  # noqa: E402
from distgrad.profiler import profile  # noqa: E402

TARGET = 1.5  # a profiled step at most this many times an unprofiled one

_linear, _tanh, _mse = F.linear.__wrapped__, distgrad.Tensor.tanh.__wrapped__, \
    F.mse_loss.__wrapped__


def unwrapped_step(x, y, ws, bs):
    """bench_engine's distgrad step calling the ops past their profiler wrappers."""
    for p in ws + bs:
        p.grad = None
    h = x
    for w, b in zip(ws, bs):
        h = _tanh(_linear(h, w, b))
    loss = _mse(h, y)
    loss.backward()
    return loss


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer repetitions")
    parser.add_argument("--reps", type=int, default=None)
    parser.add_argument("--shape", action="append", help="only these shapes (B8-D16-L32...)")
    args = parser.parse_args(argv)
    reps = args.reps or (5 if args.quick else 15)
    try:
        import torch
        torch.set_num_threads(1)
    except ImportError:
        torch = None
    rows = []
    for batch, width, layers in be.SHAPES:
        shape = f"B{batch}-D{width}-L{layers}"
        if args.shape and shape not in args.shape:
            continue
        rng = np.random.default_rng(1)
        x = rng.standard_normal((batch, width)).astype(np.float32)
        y = rng.standard_normal((batch, width)).astype(np.float32)
        ws, bs = be.make_params(width, layers)
        inner = min(400, max(3, int(2e7 // (batch * width * width * layers))))
        dg = be.distgrad_setup(x, y, ws, bs)
        candidates = {
            "numpy": (be.numpy_step, (x, y, ws, bs)),
            "distgrad": (be.distgrad_step, dg),
            "profiled": (be.distgrad_step, dg),
            "unwrapped": (unwrapped_step, dg),
        }
        around = {"profiled": profile}  # a profile open around each round of these
        if torch is not None:
            tg = be.torch_setup(x, y, ws, bs)
            candidates["torch"] = (be.torch_step, tg)
            candidates["torch_profiled"] = (be.torch_step, tg)
            around["torch_profiled"] = torch.profiler.profile
        row = {"shape": shape}
        for clock, suffix in ((time.perf_counter, ""), (time.thread_time, "_cpu")):
            us = be.time_steps(candidates, reps, inner, around, clock)
            row.update({f"{k}{suffix}_us": v for k, v in us.items()})
            row[f"ratio{suffix}"] = us["profiled"] / us["distgrad"]
            row[f"wrapper_cost{suffix}"] = us["distgrad"] / us["unwrapped"] - 1
            row[f"torch_ratio{suffix}"] = us["torch_profiled"] / us["torch"] \
                if torch is not None else None
        rows.append(row)
    na = "n/a"
    print(f"Profiled MLP step (bench_engine's) vs unprofiled, median of {reps} repetitions; "
          f"target ratio <= {TARGET}; wall time, then the thread's CPU time")
    print(f"{'shape':<14}{'numpy us':>10}{'distgrad us':>13}{'profiled us':>13}{'ratio':>7}"
          f"{'wrappers':>10}{'torch us':>10}{'torch prof us':>15}{'torch ratio':>13}"
          f"{'CPU ratio':>11}{'CPU wrappers':>14}{'torch CPU ratio':>17}")
    for r in rows:
        torch_cols = (f"{r['torch_us']:>10.1f}{r['torch_profiled_us']:>15.1f}"
                      f"{r['torch_ratio']:>13.2f}" if r["torch_ratio"] is not None
                      else f"{na:>10}{na:>15}{na:>13}")
        torch_cpu = f"{r['torch_ratio_cpu']:>17.2f}" if r["torch_ratio_cpu"] is not None \
            else f"{na:>17}"
        print(f"{r['shape']:<14}{r['numpy_us']:>10.1f}{r['distgrad_us']:>13.1f}"
              f"{r['profiled_us']:>13.1f}{r['ratio']:>7.2f}{r['wrapper_cost']:>+9.1%} "
              + torch_cols + f"{r['ratio_cpu']:>11.2f}{r['wrapper_cost_cpu']:>+13.1%} "
              + torch_cpu)
    worst = max(r["ratio"] for r in rows)
    worst_cpu = max(r["ratio_cpu"] for r in rows)
    print(f"worst ratio {worst:.2f} wall, {worst_cpu:.2f} CPU (target {TARGET}); 'wrappers': "
          "the unprofiled step's cost over the same step with the ops' wrappers bypassed")
    print(json.dumps({"benchmark": "profiler", "reps": reps, "target_ratio": TARGET,
                      "worst_ratio": round(worst, 3), "worst_ratio_cpu": round(worst_cpu, 3),
                      "rows": [{k: (round(v, 3) if isinstance(v, float) else v)
                                for k, v in r.items()} for r in rows]}))
    return 0


if __name__ == "__main__":
    sys.exit(main())

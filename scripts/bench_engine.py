"""Benchmark: one MLP training step (forward + backward) in distgrad vs its floor.

The floor is hand-written NumPy backprop of the same MLP (tanh, float32) in this
same script; PyTorch eager (one thread) runs too when installed. Prints a table
of medians and ratios and one JSON line. Peak memory of a step is measured with
tracemalloc, which sees NumPy's buffers.

    python scripts/bench_engine.py            # all shapes
    python scripts/bench_engine.py --quick    # fewer repetitions
"""
import argparse
import contextlib
import gc
import json
import os
import statistics
import sys
import time
import tracemalloc

# One BLAS thread for everyone (PyTorch runs with one thread below too): on a shared
# two-core machine a second BLAS thread measures contention, not the engine.
for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import numpy as np  # noqa: E402

import distgrad  # noqa: E402
import distgrad.nn.functional as F  # noqa: E402

SHAPES = [(32, 64, 8), (256, 512, 8), (8, 16, 32)]  # (batch, width, layers)


def make_params(width, layers, seed=0):
    rng = np.random.default_rng(seed)
    bound = 1 / np.sqrt(width)
    ws = [rng.uniform(-bound, bound, (width, width)).astype(np.float32) for _ in range(layers)]
    bs = [rng.uniform(-bound, bound, (width,)).astype(np.float32) for _ in range(layers)]
    return ws, bs


def numpy_step(x, y, ws, bs):
    """Hand-written backprop: h = tanh(h @ W.T + b), loss = mean((h - y)^2)."""
    hs = [x]
    h = x
    for w, b in zip(ws, bs):
        h = np.tanh(h @ w.T + b)
        hs.append(h)
    diff = h - y
    loss = float((diff * diff).mean())
    g = diff * (2.0 / diff.size)
    gws, gbs = [None] * len(ws), [None] * len(ws)
    for i in range(len(ws) - 1, -1, -1):
        out = hs[i + 1]
        gz = g * (1 - out * out)
        gws[i] = gz.T @ hs[i]
        gbs[i] = gz.sum(0)
        g = gz @ ws[i]
    return loss, gws, gbs


def distgrad_setup(x, y, ws, bs):
    return (distgrad.from_numpy(x), distgrad.from_numpy(y),
            [distgrad.from_numpy(w.copy()).requires_grad_() for w in ws],
            [distgrad.from_numpy(b.copy()).requires_grad_() for b in bs])


def distgrad_step(x, y, ws, bs):
    for p in ws + bs:
        p.grad = None
    h = x
    for w, b in zip(ws, bs):
        h = F.linear(h, w, b).tanh()
    loss = F.mse_loss(h, y)
    loss.backward()
    return loss


def distgrad_sequential_setup(x, y, ws, bs):
    nn = distgrad.nn
    layers = []
    for w, b in zip(ws, bs):
        lin = nn.Linear(w.shape[1], w.shape[0])
        with distgrad.no_grad():
            lin.weight.copy_(distgrad.from_numpy(w))
            lin.bias.copy_(distgrad.from_numpy(b))
        layers += [lin, nn.Tanh()]
    return distgrad.from_numpy(x), distgrad.from_numpy(y), nn.Sequential(*layers)


def distgrad_sequential_step(x, y, model):
    model.zero_grad(set_to_none=True)
    loss = distgrad.nn.functional.mse_loss(model(x), y)
    loss.backward()
    return loss


def torch_setup(x, y, ws, bs):
    import torch
    torch.set_num_threads(1)
    return (torch.from_numpy(x), torch.from_numpy(y),
            [torch.from_numpy(w.copy()).requires_grad_() for w in ws],
            [torch.from_numpy(b.copy()).requires_grad_() for b in bs])


def torch_step(x, y, ws, bs):
    import torch
    for p in ws + bs:
        p.grad = None
    h = x
    for w, b in zip(ws, bs):
        h = torch.nn.functional.linear(h, w, b).tanh()
    loss = torch.nn.functional.mse_loss(h, y)
    loss.backward()
    return loss


def time_steps(candidates, reps, inner, around=None, clock=time.perf_counter):
    """Median over `reps` rounds of the mean time of `inner` consecutive steps, in microseconds.

    Candidates run round-robin within each round, so a burst of load on a shared
    machine hits all of them alike and the ratios stay meaningful; each round starts
    one candidate later than the one before, so none always follows the same one.
    `around` maps a candidate to a context manager factory entered around each of its
    rounds (and its warm-up), outside the timing: a profiler, say (bench_profiler.py).
    `clock`: wall time, or the thread's CPU time (``time.thread_time``).
    """
    around = around or {}
    for name, (step, args) in candidates.items():
        with around.get(name, contextlib.nullcontext)():
            for _ in range(max(2, inner // 4)):
                step(*args)
    samples = {name: [] for name in candidates}
    names = list(candidates)
    for r in range(reps):
        for name in names[r % len(names):] + names[:r % len(names)]:
            step, args = candidates[name]
            with around.get(name, contextlib.nullcontext)():
                t0 = clock()
                for _ in range(inner):
                    step(*args)
                samples[name].append((clock() - t0) / inner * 1e6)
    return {name: statistics.median(v) for name, v in samples.items()}


def peak_memory(step, args):
    """Peak bytes allocated during one step, above what was live before it."""
    step(*args)
    gc.collect()
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    tracemalloc.reset_peak()
    step(*args)
    peak = tracemalloc.get_traced_memory()[1] - base
    tracemalloc.stop()
    return peak


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer repetitions")
    parser.add_argument("--reps", type=int, default=None)
    args = parser.parse_args(argv)
    reps = args.reps or (5 if args.quick else 15)
    try:
        import torch  # noqa: F401
        have_torch = True
    except ImportError:
        have_torch = False
    has_sequential = hasattr(distgrad.nn, "Sequential")
    rows = []
    for batch, width, layers in SHAPES:
        rng = np.random.default_rng(1)
        x = rng.standard_normal((batch, width)).astype(np.float32)
        y = rng.standard_normal((batch, width)).astype(np.float32)
        ws, bs = make_params(width, layers)
        work = batch * width * width * layers
        inner = max(3, int(2e7 // max(work, 1)))
        inner = min(inner, 400)
        dg_args = distgrad_setup(x, y, ws, bs)
        # Same numbers first: the benchmark is meaningless if the gradients differ.
        ref_loss, ref_gws, _ = numpy_step(x, y, ws, bs)
        loss = distgrad_step(*dg_args)
        assert abs(loss.item() - ref_loss) < 1e-4 * max(1, abs(ref_loss)), (loss.item(), ref_loss)
        np.testing.assert_allclose(dg_args[2][0].grad.numpy(), ref_gws[0], rtol=1e-3, atol=1e-5)
        row = {"shape": f"B{batch}-D{width}-L{layers}"}
        candidates = {"numpy": (numpy_step, (x, y, ws, bs)), "distgrad": (distgrad_step, dg_args)}
        if has_sequential:
            candidates["sequential"] = (distgrad_sequential_step,
                                        distgrad_sequential_setup(x, y, ws, bs))
        if have_torch:
            candidates["torch"] = (torch_step, torch_setup(x, y, ws, bs))
        for name, us in time_steps(candidates, reps, inner).items():
            row[f"{name}_us"] = us
        row["numpy_peak_kb"] = peak_memory(numpy_step, (x, y, ws, bs)) / 1024
        row["distgrad_peak_kb"] = peak_memory(distgrad_step, dg_args) / 1024
        row["ratio"] = row["distgrad_us"] / row["numpy_us"]
        row["mem_ratio"] = row["distgrad_peak_kb"] / row["numpy_peak_kb"]
        if has_sequential:
            row["sequential_vs_raw"] = row["sequential_us"] / row["distgrad_us"]
        if have_torch:
            row["torch_ratio"] = row["torch_us"] / row["numpy_us"]
        rows.append(row)
    header = (f"{'shape':<14}{'numpy us':>10}{'distgrad us':>13}{'ratio':>8}"
              + (f"{'nn.Seq us':>11}{'seq/raw':>9}" if has_sequential else "")
              + (f"{'torch us':>10}{'torch ratio':>13}" if have_torch else "")
              + f"{'peak KB np':>12}{'peak KB dg':>12}{'mem ratio':>11}")
    print(f"MLP step (forward + backward, tanh, float32), median of {reps} repetitions")
    print(header)
    for r in rows:
        line = f"{r['shape']:<14}{r['numpy_us']:>10.1f}{r['distgrad_us']:>13.1f}{r['ratio']:>8.2f}"
        if has_sequential:
            line += f"{r['sequential_us']:>11.1f}{r['sequential_vs_raw']:>9.2f}"
        if have_torch:
            line += f"{r['torch_us']:>10.1f}{r['torch_ratio']:>13.2f}"
        line += f"{r['numpy_peak_kb']:>12.0f}{r['distgrad_peak_kb']:>12.0f}{r['mem_ratio']:>11.2f}"
        print(line)
    print(json.dumps({"benchmark": "engine", "reps": reps,
                      "rows": [{k: (round(v, 3) if isinstance(v, float) else v)
                                for k, v in r.items()} for r in rows]}))
    return 0


if __name__ == "__main__":
    import perf_page
    with perf_page.recorded("bench_engine"):  # with --record: its section of docs/performance.md
        sys.exit(main())

"""Benchmark: one optimizer step on 4.2M float32 parameters, distgrad vs its NumPy floor
and PyTorch (one thread each).

The parameters are one stage of ``configs/wide.toml`` (four 1024x1024 layers and their
biases), every one with a gradient. The floor is the same update written by hand in
NumPy with every intermediate in one preallocated buffer: what the arithmetic itself
costs. PyTorch runs its default CPU implementation (``foreach=None``) with one thread.
Before timing, the three are checked to compute the same parameters after a few
steps. Candidates are interleaved, medians of several repetitions. Prints a table and
one JSON line.

    python scripts/bench_optim.py [--quick]
"""
import argparse
import json
import math
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_layers import _single_threaded_reexec  # noqa: E402 - the same one-thread re-exec

SHAPES = [(1024, 1024)] * 4 + [(1024,)] * 4
LR, MOMENTUM, BETAS, EPS, DECAY = 1e-3, 0.9, (0.9, 0.999), 1e-8, 1e-2
CASES = {  # name: (optimizer class name, its options)
    "SGD": ("SGD", {"lr": LR}),
    "SGD momentum": ("SGD", {"lr": LR, "momentum": MOMENTUM}),
    "Adam": ("Adam", {"lr": LR, "betas": BETAS, "eps": EPS}),
    "AdamW": ("AdamW", {"lr": LR, "betas": BETAS, "eps": EPS, "weight_decay": DECAY}),
}


class NumpyFloor:
    """The update rules by hand, in place, intermediates in one scratch buffer."""

    def __init__(self, name, params, grads):
        import numpy as np
        self.np, self.name, self.params, self.grads = np, name, params, grads
        self.m = [np.zeros_like(p) for p in params]
        self.v = [np.zeros_like(p) for p in params]
        self.scratch = np.empty(max(p.size for p in params), np.float32)
        self.t = 0

    def step(self):
        np = self.np
        self.t += 1
        b1, b2 = BETAS
        for p, g, m, v in zip(self.params, self.grads, self.m, self.v):
            tmp = self.scratch[:p.size].reshape(p.shape)
            if self.name == "SGD":
                p -= np.multiply(g, LR, out=tmp)
                continue
            if self.name == "SGD momentum":
                if self.t == 1:
                    m[...] = g
                else:
                    m *= MOMENTUM
                    m += g
                p -= np.multiply(m, LR, out=tmp)
                continue
            if self.name == "AdamW":
                p *= 1 - LR * DECAY
            np.subtract(g, m, out=tmp)
            tmp *= 1 - b1
            m += tmp
            v *= b2
            np.multiply(g, 1 - b2, out=tmp)
            tmp *= g
            v += tmp
            np.sqrt(v, out=tmp)
            tmp /= (1 - b2 ** self.t) ** 0.5
            tmp += EPS
            np.divide(m, tmp, out=tmp)
            tmp *= LR / (1 - b1 ** self.t)
            p -= tmp


def _setups(name):
    """{candidate: (step function, parameters as NumPy arrays)} for case ``name``."""
    import numpy as np
    import distgrad
    rng = np.random.default_rng(0)
    values = [rng.standard_normal(s).astype(np.float32) for s in SHAPES]
    grads = [rng.standard_normal(s).astype(np.float32) for s in SHAPES]
    cls, options = CASES[name]
    out = {}
    ours = [distgrad.nn.Parameter(distgrad.tensor(v.copy())) for v in values]
    for p, g in zip(ours, grads):
        p.grad = distgrad.tensor(g.copy())
    opt = getattr(distgrad.optim, cls)(ours, **options)
    out["distgrad"] = (opt.step, lambda: [p.detach().numpy() for p in ours])
    floor = NumpyFloor(name, [v.copy() for v in values], grads)
    out["numpy floor"] = (floor.step, lambda: floor.params)
    try:
        import torch
    except ImportError:
        return out
    torch.set_num_threads(1)
    theirs = [torch.nn.Parameter(torch.from_numpy(v.copy())) for v in values]
    for p, g in zip(theirs, grads):
        p.grad = torch.from_numpy(g.copy())
    topt = getattr(torch.optim, cls)(theirs, **options)
    out["torch"] = (topt.step, lambda: [p.detach().numpy() for p in theirs])
    return out


def _check_same(name, setups, steps=3):
    import numpy as np
    for step, _ in setups.values():
        for _ in range(steps):
            step()
    reference = setups["numpy floor"][1]()
    for who, (_, params) in setups.items():
        for mine, ref in zip(params(), reference):
            np.testing.assert_allclose(mine, ref, rtol=1e-5, atol=1e-6,
                                       err_msg=f"{name}: {who} differs from the floor")


def _time(setups, reps, batches):
    times = {who: [] for who in setups}
    for _ in range(batches):
        for who, (step, _) in setups.items():
            t = time.perf_counter()
            for _ in range(reps):
                step()
            times[who].append((time.perf_counter() - t) / reps * 1e3)
    return {who: statistics.median(v) for who, v in times.items()}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    _single_threaded_reexec()
    reps, batches = (3, 3) if args.quick else (10, 7)
    rows = {}
    for name in CASES:
        _check_same(name, _setups(name))
        rows[name] = _time(_setups(name), reps, batches)
    have_torch = all("torch" in r for r in rows.values())
    print("optimizer step on 4.2M float32 parameters (one thread; medians, ms)")
    head = f"{'optimizer':14s} {'numpy floor':>11s} {'distgrad':>9s} {'x floor':>8s}"
    if have_torch:
        head += f" {'torch':>8s} {'x torch':>8s}"
    print(head)
    result = {}
    for name, r in rows.items():
        line = (f"{name:14s} {r['numpy floor']:11.2f} {r['distgrad']:9.2f} "
                f"{r['distgrad'] / r['numpy floor']:8.2f}")
        result[name] = {"floor_ms": r["numpy floor"], "distgrad_ms": r["distgrad"],
                        "vs_floor": r["distgrad"] / r["numpy floor"]}
        if have_torch:
            line += f" {r['torch']:8.2f} {r['distgrad'] / r['torch']:8.2f}"
            result[name].update(torch_ms=r["torch"], vs_torch=r["distgrad"] / r["torch"])
        print(line)
    print(json.dumps({"bench": "optim", "parameters": sum(math.prod(s) for s in SHAPES),
                      "cases": result}))


if __name__ == "__main__":
    import perf_page
    with perf_page.recorded("bench_optim"):  # with --record: its section of docs/performance.md
        main()

"""Benchmark: forward + backward of single ops, distgrad vs PyTorch vs plain NumPy.

For every elementwise, reduction and shape op below, on a few shapes and dtypes:
``y = op(x); y.backward(g)`` in distgrad and in PyTorch (one thread), and the
plainest NumPy expression of the same math (the forward and its hand-written
VJP). Prints a table of medians, then every op slower than BOTH PyTorch and NumPy
by more than 2x (the list should be empty), and one JSON line.

    python scripts/bench_ops.py             # every op, shapes and dtypes
    python scripts/bench_ops.py --quick     # fewer repetitions
    python scripts/bench_ops.py --op exp --op sum
"""
import argparse
import json
import math
import os
import statistics
import sys
import time

for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import numpy as np  # noqa: E402

import distgrad  # noqa: E402

SHAPES = [(64, 64), (256, 1024)]
DTYPES = ["float32", "float64"]
SLOW_FACTOR = 2.0


def _sig(x):
    return 1 / (1 + np.exp(-x))


def _erf(x):
    return np.vectorize(math.erf, otypes=[x.dtype])(x)


def _softmax(x):
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


# name: (op on the library module and input, NumPy forward+VJP returning (y, dx) from x, g,
#        how inputs are drawn: "any", "positive")
OPS = {
    # elementwise
    "neg": (lambda m, x: -x, lambda x, g: (-x, -g), "any"),
    "exp": (lambda m, x: x.exp(), lambda x, g: (lambda y: (y, g * y))(np.exp(x)), "any"),
    "log": (lambda m, x: x.log(), lambda x, g: (np.log(x), g / x), "positive"),
    "sqrt": (lambda m, x: x.sqrt(), lambda x, g: (lambda y: (y, g / (2 * y)))(np.sqrt(x)),
             "positive"),
    "rsqrt": (lambda m, x: x.rsqrt(),
              lambda x, g: (lambda y: (y, -0.5 * g * y * y * y))(1 / np.sqrt(x)), "positive"),
    "abs": (lambda m, x: x.abs(), lambda x, g: (np.abs(x), g * np.sign(x)), "any"),
    "sin": (lambda m, x: x.sin(), lambda x, g: (np.sin(x), g * np.cos(x)), "any"),
    "cos": (lambda m, x: x.cos(), lambda x, g: (np.cos(x), -g * np.sin(x)), "any"),
    "tanh": (lambda m, x: x.tanh(), lambda x, g: (lambda y: (y, g * (1 - y * y)))(np.tanh(x)),
             "any"),
    "sigmoid": (lambda m, x: x.sigmoid(),
                lambda x, g: (lambda y: (y, g * y * (1 - y)))(_sig(x)), "any"),
    "relu": (lambda m, x: x.relu(), lambda x, g: (np.maximum(x, 0), g * (x > 0)), "any"),
    "gelu_tanh": (lambda m, x: m.nn.functional.gelu(x, approximate="tanh"),
                  lambda x, g: _gelu_tanh(x, g), "any"),
    "gelu": (lambda m, x: m.nn.functional.gelu(x), lambda x, g: _gelu(x, g), "any"),
    "square": (lambda m, x: x.square(), lambda x, g: (x * x, 2 * g * x), "any"),
    "pow3": (lambda m, x: x ** 3, lambda x, g: (x * x * x, 3 * g * x * x), "any"),
    "pow2.5": (lambda m, x: x ** 2.5, lambda x, g: (x ** 2.5, 2.5 * g * x ** 1.5), "positive"),
    "reciprocal": (lambda m, x: x.reciprocal(), lambda x, g: (lambda y: (y, -g * y * y))(1 / x),
                   "positive"),
    "clamp": (lambda m, x: x.clamp(-0.5, 0.5),
              lambda x, g: (np.clip(x, -0.5, 0.5), g * ((x >= -0.5) & (x <= 0.5))), "any"),
    "add": (lambda m, x: x + x, lambda x, g: (x + x, g + g), "any"),
    "mul": (lambda m, x: x * x, lambda x, g: (x * x, 2 * g * x), "any"),
    "div": (lambda m, x: x / (x + 3), lambda x, g: _div(x, g), "positive"),
    "mul_scalar": (lambda m, x: x * 3, lambda x, g: (x * 3, g * 3), "any"),
    "add_broadcast": (lambda m, x: x + x[0], lambda x, g: (x + x[0], _bcast_add_grad(g)), "any"),
    "maximum": (lambda m, x: m.maximum(x, x.flip(0)),
                lambda x, g: _maximum(x, g), "any"),
    "where": (lambda m, x: m.where(x > 0, x, x * 2),
              lambda x, g: (np.where(x > 0, x, x * 2), np.where(x > 0, g, 2 * g)), "any"),
    # reductions
    "sum": (lambda m, x: x.sum(), lambda x, g: (x.sum(), np.broadcast_to(g, x.shape).copy()),
            "any"),
    "sum_dim": (lambda m, x: x.sum(-1),
                lambda x, g: (x.sum(-1), np.broadcast_to(g[..., None], x.shape).copy()), "any"),
    "mean_dim": (lambda m, x: x.mean(-1), lambda x, g: (
        x.mean(-1), np.broadcast_to(g[..., None] / x.shape[-1], x.shape).copy()), "any"),
    "var_dim": (lambda m, x: x.var(-1), lambda x, g: _var(x, g), "any"),
    "amax_dim": (lambda m, x: x.amax(-1), lambda x, g: _amax(x, g), "any"),
    "max_dim": (lambda m, x: x.max(-1)[0], lambda x, g: _amax(x, g), "any"),
    "logsumexp": (lambda m, x: x.logsumexp(-1), lambda x, g: _logsumexp(x, g), "any"),
    "softmax": (lambda m, x: x.softmax(-1), lambda x, g: _softmax_vjp(x, g), "any"),
    "log_softmax": (lambda m, x: x.log_softmax(-1), lambda x, g: _log_softmax_vjp(x, g), "any"),
    "cumsum": (lambda m, x: x.cumsum(-1),
               lambda x, g: (np.cumsum(x, -1), np.flip(np.cumsum(np.flip(g, -1), -1), -1)), "any"),
    # shape ops
    "reshape": (lambda m, x: x.reshape(-1), lambda x, g: (x.reshape(-1), g.reshape(x.shape)),
                "any"),
    "transpose": (lambda m, x: x.t(), lambda x, g: (x.T, g.T), "any"),
    "transpose_contiguous": (lambda m, x: x.t().contiguous(),
                             lambda x, g: (np.ascontiguousarray(x.T), np.ascontiguousarray(g.T)),
                             "any"),
    "unsqueeze": (lambda m, x: x.unsqueeze(0), lambda x, g: (x[None], g[0]), "any"),
    "expand": (lambda m, x: x[:1].expand(x.shape[0], -1),
               lambda x, g: (np.broadcast_to(x[:1], x.shape), _first_row_grad(x, g)), "any"),
    "slice": (lambda m, x: x[1:-1], lambda x, g: (x[1:-1], _slice_grad(x, g)), "any"),
    "index_rows": (lambda m, x: x[m.tensor([0, 2, 1])],
                   lambda x, g: (x[[0, 2, 1]], _rows_grad(x, g)), "any"),
    "cat": (lambda m, x: m.cat([x, x], 0),
            lambda x, g: (np.concatenate([x, x], 0), g[:x.shape[0]] + g[x.shape[0]:]), "any"),
    "stack": (lambda m, x: m.stack([x, x], 0),
              lambda x, g: (np.stack([x, x], 0), g[0] + g[1]), "any"),
    "split": (lambda m, x: x.split(x.shape[0] // 2, 0)[0],
              lambda x, g: (x[:x.shape[0] // 2], _slice_grad(x, g, x.shape[0] // 2)), "any"),
    "flip": (lambda m, x: x.flip(0), lambda x, g: (np.flip(x, 0).copy(), np.flip(g, 0).copy()),
             "any"),
    "masked_fill": (lambda m, x: x.masked_fill(x > 1, 0.0),
                    lambda x, g: (np.where(x > 1, 0, x), np.where(x > 1, 0, g)), "any"),
}


def _gelu_tanh(x, g):
    k = math.sqrt(2 / math.pi)
    inner = k * (x + 0.044715 * x * x * x)
    t = np.tanh(inner)
    y = 0.5 * x * (1 + t)
    d = 0.5 * (1 + t) + 0.5 * x * (1 - t * t) * k * (1 + 3 * 0.044715 * x * x)
    return y, g * d


def _gelu(x, g):
    cdf = 0.5 * (1 + _erf(x / math.sqrt(2)))
    return x * cdf, g * (cdf + x * np.exp(-0.5 * x * x) / math.sqrt(2 * math.pi))


def _div(x, g):
    d = x + 3
    return x / d, g / d - g * x / (d * d)


def _bcast_add_grad(g):
    out = g.copy()
    out[0] += g.sum(0)
    return out


def _maximum(x, g):
    xf = np.flip(x, 0)
    take = x >= xf
    return np.maximum(x, xf), np.where(take, g, 0) + np.flip(np.where(take, 0, g), 0)


def _var(x, g):
    n = x.shape[-1]
    c = x - x.mean(-1, keepdims=True)
    return (c * c).sum(-1) / (n - 1), g[..., None] * c * (2 / (n - 1))


def _amax(x, g):
    y = x.max(-1)
    hit = x == y[..., None]
    return y, np.where(hit, g[..., None] / hit.sum(-1, keepdims=True), 0)


def _logsumexp(x, g):
    mx = x.max(-1, keepdims=True)
    y = np.log(np.exp(x - mx).sum(-1)) + mx[..., 0]
    return y, g[..., None] * np.exp(x - y[..., None])


def _softmax_vjp(x, g):
    y = _softmax(x)
    return y, y * (g - (g * y).sum(-1, keepdims=True))


def _log_softmax_vjp(x, g):
    s = x - x.max(-1, keepdims=True)
    y = s - np.log(np.exp(s).sum(-1, keepdims=True))
    return y, g - np.exp(y) * g.sum(-1, keepdims=True)


def _first_row_grad(x, g):
    out = np.zeros_like(x)
    out[0] = g.sum(0)
    return out


def _slice_grad(x, g, stop=None):
    out = np.zeros_like(x)
    if stop is None:
        out[1:-1] = g
    else:
        out[:stop] = g
    return out


def _rows_grad(x, g):
    out = np.zeros_like(x)
    np.add.at(out, [0, 2, 1], g)
    return out


def _input(shape, dtype, kind, seed=0):
    x = np.random.default_rng(seed).standard_normal(shape).astype(dtype)
    return np.abs(x) + 0.5 if kind == "positive" else x


def _candidates(name, x_np, torch):
    op, floor, kind = OPS[name]
    y_shape = np.shape(op(distgrad, distgrad.from_numpy(x_np)))
    g_np = np.random.default_rng(1).standard_normal(y_shape).astype(x_np.dtype)
    x_dg = distgrad.from_numpy(x_np.copy()).requires_grad_()
    g_dg = distgrad.from_numpy(g_np)

    def run_distgrad():
        x_dg.grad = None
        op(distgrad, x_dg).backward(g_dg)
        return x_dg.grad

    def run_numpy():
        return floor(x_np, g_np)[1]

    steps = {"numpy": run_numpy, "distgrad": run_distgrad}
    if torch is not None:
        x_t = torch.from_numpy(x_np.copy()).requires_grad_()
        g_t = torch.from_numpy(g_np)

        def run_torch():
            x_t.grad = None
            op(torch, x_t).backward(g_t)
            return x_t.grad
        steps["torch"] = run_torch
    return steps


def _check(name, steps):
    """The same gradient from each candidate, or the benchmark times different math."""
    ref = np.asarray(steps["numpy"]())
    got = steps["distgrad"]().numpy()
    tol = 1e-4 if ref.dtype == np.float32 else 1e-9
    np.testing.assert_allclose(got, ref, rtol=tol, atol=tol, err_msg=name)
    if "torch" in steps:
        np.testing.assert_allclose(steps["torch"]().numpy(), ref, rtol=tol, atol=tol,
                                   err_msg=name)


def _time(steps, reps, budget=0.004):
    """Median per-call microseconds over ``reps`` rounds, candidates round-robin."""
    inner = {}
    for name, step in steps.items():
        step()
        t0 = time.perf_counter()
        step()
        once = max(time.perf_counter() - t0, 1e-7)
        inner[name] = max(1, min(200, int(budget / once)))
    samples = {name: [] for name in steps}
    for _ in range(reps):
        for name, step in steps.items():
            n = inner[name]
            t0 = time.perf_counter()
            for _ in range(n):
                step()
            samples[name].append((time.perf_counter() - t0) / n * 1e6)
    return {name: statistics.median(v) for name, v in samples.items()}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer repetitions")
    parser.add_argument("--reps", type=int, default=None)
    parser.add_argument("--op", action="append", help="run only these ops")
    args = parser.parse_args(argv)
    reps = args.reps or (3 if args.quick else 7)
    try:
        import torch
        torch.set_num_threads(1)
    except ImportError:
        torch = None
    rows = []
    for name in OPS:
        if args.op and name not in args.op:
            continue
        for shape in SHAPES:
            for dtype in DTYPES:
                x = _input(shape, dtype, OPS[name][2])
                steps = _candidates(name, x, torch)
                _check(name, steps)
                t = _time(steps, reps)
                row = {"op": name, "shape": "x".join(map(str, shape)), "dtype": dtype,
                       "numpy_us": t["numpy"], "distgrad_us": t["distgrad"],
                       "torch_us": t.get("torch"), "vs_numpy": t["distgrad"] / t["numpy"]}
                row["vs_torch"] = t["distgrad"] / t["torch"] if "torch" in t else None
                row["slow"] = row["vs_numpy"] > SLOW_FACTOR and (
                    row["vs_torch"] is None or row["vs_torch"] > SLOW_FACTOR)
                rows.append(row)
    print(f"Op forward + backward (one thread), median of {reps} repetitions")
    print(f"{'op':<22}{'shape':>10}{'dtype':>9}{'numpy us':>10}{'distgrad us':>13}"
          f"{'torch us':>10}{'/numpy':>8}{'/torch':>8}")
    for r in rows:
        theirs = (f"{r['torch_us']:>10.1f}" if r["torch_us"] is not None else f"{'n/a':>10}")
        vs_t = f"{r['vs_torch']:>8.2f}" if r["vs_torch"] is not None else f"{'n/a':>8}"
        print(f"{r['op']:<22}{r['shape']:>10}{r['dtype']:>9}{r['numpy_us']:>10.1f}"
              f"{r['distgrad_us']:>13.1f}{theirs}{r['vs_numpy']:>8.2f}{vs_t}"
              + ("  SLOW" if r["slow"] else ""))
    slow = [f"{r['op']} {r['shape']} {r['dtype']}" for r in rows if r["slow"]]
    print(f"slower than both PyTorch and NumPy by more than {SLOW_FACTOR}x: "
          + (", ".join(slow) if slow else "none"))
    print(json.dumps({"benchmark": "ops", "reps": reps, "slow": slow,
                      "rows": [{k: (round(v, 3) if isinstance(v, float) else v)
                                for k, v in r.items()} for r in rows]}))
    return 1 if slow else 0


if __name__ == "__main__":
    import perf_page
    with perf_page.recorded("bench_ops"):  # with --record: its section of docs/performance.md
        sys.exit(main())

"""Benchmark: forward + backward of nn layers, distgrad vs PyTorch eager (one thread each).

Each case builds the same layer in both libraries (PyTorch's initialised
parameters copied into distgrad's) and times one training step: forward, a sum
of the output, backward. NumPy's BLAS and PyTorch both run on one thread: the
script re-executes itself with the thread variables set before NumPy loads.
Where a case has a floor, the same step written by hand on arrays with the fused
kernels of ``distgrad.ops`` runs too: what distgrad's graph costs on top.
Prints a table of medians and ratios and one JSON line.

    python scripts/bench_layers.py            # all cases
    python scripts/bench_layers.py --quick    # fewer repetitions
    python scripts/bench_layers.py --case transformer_encoder_layer
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

_THREAD_VARS = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")


def _single_threaded_reexec():
    """Run again in a fresh process with one BLAS thread (it must be set before NumPy loads)."""
    if all(os.environ.get(v) == "1" for v in _THREAD_VARS):
        return
    env = dict(os.environ, **{v: "1" for v in _THREAD_VARS})
    sys.exit(subprocess.call([sys.executable, *sys.argv], env=env))


def _copy_torch_params(ours, theirs):
    """PyTorch's initial parameters into distgrad's module (its own init without PyTorch)."""
    import distgrad
    if theirs is not None:
        ours.load_state_dict({k: distgrad.tensor(v.detach().numpy().copy())
                              for k, v in theirs.state_dict().items()})
    return ours


def _input(torch_x, shape):
    """The same input as PyTorch's, or a seeded one of ``shape`` without PyTorch."""
    import distgrad
    if torch_x is None:
        distgrad.manual_seed(0)
        return distgrad.randn(*shape, requires_grad=True)
    return distgrad.tensor(torch_x.detach().numpy().copy(), requires_grad=True)


# Each case: (name, build_distgrad, build_torch). A builder returns (module, input):
# the step runs module(input), sums the output and runs backward; the distgrad builder
# receives the torch module and input so both start from the same numbers.

def _encoder_layer_case(d_model=128, nhead=8, dim_feedforward=512, seq=64, batch=16):
    shape = (batch, seq, d_model)

    def build_torch():
        import torch
        torch.manual_seed(0)
        layer = torch.nn.TransformerEncoderLayer(d_model, nhead, dim_feedforward, dropout=0.0,
                                                 batch_first=True)
        x = torch.randn(*shape, requires_grad=True)
        return layer, x

    def build_distgrad(torch_layer, torch_x):
        import distgrad
        layer = distgrad.nn.TransformerEncoderLayer(d_model, nhead, dim_feedforward, dropout=0.0,
                                                    batch_first=True)
        _copy_torch_params(layer, torch_layer)
        return layer, _input(torch_x, shape)

    return build_distgrad, build_torch


def _mha_case(embed_dim=128, num_heads=8, seq=64, batch=16, need_weights=False):
    shape = (batch, seq, embed_dim)

    def build_torch():
        import torch
        torch.manual_seed(0)
        mha = torch.nn.MultiheadAttention(embed_dim, num_heads, batch_first=True)
        x = torch.randn(*shape, requires_grad=True)
        return _Callable(mha, need_weights), x

    def build_distgrad(torch_mod, torch_x):
        import distgrad
        mha = distgrad.nn.MultiheadAttention(embed_dim, num_heads, batch_first=True)
        _copy_torch_params(mha, torch_mod.module if torch_mod is not None else None)
        return _Callable(mha, need_weights), _input(torch_x, shape)

    return build_distgrad, build_torch


class _Callable:
    """Self-attention through an MHA module, returning the output only."""

    def __init__(self, module, need_weights):
        self.module = module
        self.need_weights = need_weights

    def __call__(self, x):
        return self.module(x, x, x, need_weights=self.need_weights)[0]

    def parameters(self):
        return self.module.parameters()


class _FirstOutput:
    """A recurrent layer's output sequence, without the final states."""

    def __init__(self, module):
        self.module = module

    def __call__(self, x):
        return self.module(x)[0]

    def parameters(self):
        return self.module.parameters()


def _same_model_case(make, shape, wrap=lambda m: m):
    """``make(lib)`` builds the model in either library; distgrad's gets torch's parameters."""
    def build_torch():
        import torch
        torch.manual_seed(0)
        return wrap(make(torch)), torch.randn(*shape, requires_grad=True)

    def build_distgrad(torch_mod, torch_x):
        import distgrad
        model = make(distgrad)
        _copy_torch_params(model, getattr(torch_mod, "module", torch_mod))
        return wrap(model), _input(torch_x, shape)

    return build_distgrad, build_torch


LSTM_SIZES = dict(seq=35, batch=20, features=200, hidden=200, layers=2)


def _lstm(lib):
    s = LSTM_SIZES
    return lib.nn.LSTM(s["features"], s["hidden"], s["layers"])


def _lenet(lib):
    nn, F = lib.nn, lib.nn.functional

    class LeNet(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv1 = nn.Conv2d(1, 6, 5)
            self.conv2 = nn.Conv2d(6, 16, 5)
            self.fc1 = nn.Linear(400, 120)
            self.fc2 = nn.Linear(120, 84)
            self.fc3 = nn.Linear(84, 10)

        def forward(self, x):
            x = F.max_pool2d(F.relu(self.conv1(x)), 2)
            x = F.max_pool2d(F.relu(self.conv2(x)), 2)
            x = x.reshape(x.shape[0], -1)
            return self.fc3(F.relu(self.fc2(F.relu(self.fc1(x)))))
    return LeNet()


CASES = [
    ("transformer_encoder_layer", *_encoder_layer_case()),
    ("multihead_attention", *_mha_case()),
    ("multihead_attention_weights", *_mha_case(need_weights=True)),
    ("lstm_2x200_seq35_b20", *_same_model_case(
        _lstm, (LSTM_SIZES["seq"], LSTM_SIZES["batch"], LSTM_SIZES["features"]), _FirstOutput)),
    ("lenet5_b64_32x32", *_same_model_case(_lenet, (64, 1, 32, 32))),
]


# ---------------------------------------------------------------- floors: the kernels on arrays
def _lstm_floor(model, x):
    """Both LSTM layers through the fused kernels of ``ops/rnn.py``, forward and backward."""
    import numpy as np
    from distgrad.ops import rnn as kernels
    weights = [[p.detach().numpy() for p in layer] for layer in model.module.all_weights]
    data = x.detach().numpy()
    zeros = np.zeros((data.shape[1], LSTM_SIZES["hidden"]), data.dtype)
    forward, backward = kernels._KERNELS["LSTM"]

    def step():
        saved, inp = [], data
        for w_ih, w_hh, b_ih, b_hh in weights:
            (hs, _, _), acts = forward(inp, zeros, zeros, w_ih, w_hh, b_ih, b_hh, None, False)
            saved.append((inp, acts, hs))
            inp = hs
        d_out = np.ones_like(inp)  # d sum(output)
        for (inp, acts, hs), (w_ih, w_hh, b_ih, b_hh) in zip(reversed(saved), reversed(weights)):
            d_out = backward(d_out, None, None, (inp, zeros, zeros, w_ih, w_hh, b_ih, b_hh, None),
                             acts, hs, False, (True,) * 7 + (False,))[0]
        return saved[-1][2]
    return step


def _lenet_floor(model, x):
    """The LeNet step by hand on arrays, with the conv and max-pool kernels of ``ops``."""
    import numpy as np
    from distgrad.ops import conv, pooling
    p = {k: v.numpy() for k, v in model.state_dict().items()}
    data = x.detach().numpy()

    def conv_relu_pool(inp, w, b):
        m = {"stride": (1, 1), "padding": ((0, 0), (0, 0)), "dilation": (1, 1), "groups": 1,
             "input_shape": inp.shape, "weight_shape": w.shape}
        r = np.maximum(conv._conv_np(inp, w, m) + b[:, None, None], 0)
        out = (r.shape[2] // 2, r.shape[3] // 2)
        pooled, index = pooling._window_max(r, (2, 2), (2, 2), (0, 0), (1, 1), out, r.shape[3])
        return pooled, (inp, m, r, index)

    def unpool_relu_conv_grad(d_pooled, w, cache):
        inp, m, r, index = cache
        planes = np.arange(r.shape[0] * r.shape[1]).reshape(r.shape[:2])[..., None, None]
        d_r = np.zeros(r.size, r.dtype)
        d_r[index + planes * (r.shape[2] * r.shape[3])] = d_pooled
        d_c = d_r.reshape(r.shape) * (r > 0)
        return conv._input_grad_np(d_c, w, m), conv._weight_grad_np(inp, d_c, m), d_c.sum((0, 2, 3))

    def step():
        p1, cache1 = conv_relu_pool(data, p["conv1.weight"], p["conv1.bias"])
        p2, cache2 = conv_relu_pool(p1, p["conv2.weight"], p["conv2.bias"])
        hs = [p2.reshape(p2.shape[0], -1)]
        for name in ("fc1", "fc2", "fc3"):
            z = hs[-1] @ p[name + ".weight"].T + p[name + ".bias"]
            hs.append(np.maximum(z, 0) if name != "fc3" else z)
        d = np.ones_like(hs[-1])  # d sum(logits)
        for i, name in reversed(list(enumerate(("fc1", "fc2", "fc3")))):
            _ = (d.T @ hs[i], d.sum(0))  # weight and bias gradients
            d = d @ p[name + ".weight"]
            if i > 0:
                d = d * (hs[i] > 0)
        d = unpool_relu_conv_grad(d.reshape(p2.shape), p["conv2.weight"], cache2)[0]
        unpool_relu_conv_grad(d, p["conv1.weight"], cache1)
        return hs[-1]
    return step


FLOORS = {"lstm_2x200_seq35_b20": _lstm_floor, "lenet5_b64_32x32": _lenet_floor}


def _step_fn(module, x):
    params = list(module.parameters())

    def step():
        for p in params:
            p.grad = None
        x.grad = None
        out = module(x)
        out.sum().backward()
        return out
    return step


def time_steps(candidates, reps, inner):
    """Median over ``reps`` rounds of the mean of ``inner`` steps, in ms; round-robin so a
    burst of load on a shared machine hits them all alike."""
    for step in candidates.values():
        step()
        step()
    samples = {name: [] for name in candidates}
    for _ in range(reps):
        for name, step in candidates.items():
            t0 = time.perf_counter()
            for _ in range(inner):
                step()
            samples[name].append((time.perf_counter() - t0) / inner * 1e3)
    return {name: statistics.median(v) for name, v in samples.items()}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer repetitions")
    parser.add_argument("--reps", type=int, default=None)
    parser.add_argument("--case", action="append", help="run only these cases")
    args = parser.parse_args(argv)
    reps = args.reps or (5 if args.quick else 11)
    import numpy as np
    try:
        import torch
        torch.set_num_threads(1)
    except ImportError:  # the table still runs; PyTorch's columns read n/a
        torch = None
    rows = []
    for name, build_distgrad, build_torch in CASES:
        if args.case and name not in args.case:
            continue
        torch_mod, torch_x = build_torch() if torch is not None else (None, None)
        dg_mod, dg_x = build_distgrad(torch_mod, torch_x)
        steps = {"distgrad": _step_fn(dg_mod, dg_x)}
        # Same numbers first: a benchmark of different computations means nothing.
        out = steps["distgrad"]().detach().numpy()
        if torch is not None:
            steps["torch"] = _step_fn(torch_mod, torch_x)
            np.testing.assert_allclose(out, steps["torch"]().detach().numpy(), rtol=1e-3,
                                       atol=1e-4)
            np.testing.assert_allclose(dg_x.grad.numpy(), torch_x.grad.numpy(), rtol=1e-3,
                                       atol=1e-4)
        if name in FLOORS:
            steps["floor"] = FLOORS[name](dg_mod, dg_x)
            np.testing.assert_allclose(steps["floor"](), out, rtol=1e-5, atol=1e-6)
        times = time_steps(steps, reps, inner=3)
        row = {"case": name, "distgrad_ms": times["distgrad"], "torch_ms": times.get("torch")}
        row["ratio"] = times["distgrad"] / times["torch"] if "torch" in times else None
        if "floor" in times:
            row.update(floor_ms=times["floor"], vs_floor=times["distgrad"] / times["floor"])
        rows.append(row)
    print(f"Layer step (forward + backward, float32, one thread), median of {reps} repetitions")
    print(f"{'case':<30}{'distgrad ms':>13}{'torch ms':>11}{'ratio':>8}{'floor ms':>10}"
          f"{'vs floor':>10}")
    for r in rows:
        floor = (f"{r['floor_ms']:>10.2f}{r['vs_floor']:>10.2f}" if "floor_ms" in r
                 else f"{'-':>10}{'-':>10}")
        theirs = (f"{r['torch_ms']:>11.2f}{r['ratio']:>8.2f}" if r["torch_ms"] is not None
                  else f"{'n/a':>11}{'n/a':>8}")
        print(f"{r['case']:<30}{r['distgrad_ms']:>13.2f}" + theirs + floor)
    print(json.dumps({"benchmark": "layers", "reps": reps, "rows": rows}))


if __name__ == "__main__":
    import perf_page
    _single_threaded_reexec()
    with perf_page.recorded("bench_layers"):  # with --record: its section of docs/performance.md
        main()

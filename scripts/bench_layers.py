"""Benchmark: forward + backward of nn layers, distgrad vs PyTorch eager (one thread each).

Each case builds the same layer in both libraries (PyTorch's initialised
parameters copied into distgrad's) and times one training step: forward, a sum
of the output, backward. NumPy's BLAS and PyTorch both run on one thread: the
script re-executes itself with the thread variables set before NumPy loads.
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
    import distgrad
    ours.load_state_dict({k: distgrad.tensor(v.detach().numpy().copy())
                          for k, v in theirs.state_dict().items()})
    return ours


# Each case: (name, build_distgrad, build_torch). A builder returns (step, check_value):
# step() runs forward + backward once; the torch builder receives the distgrad module
# so both start from the same parameters.

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
        x = distgrad.tensor(torch_x.detach().numpy().copy(), requires_grad=True)
        return layer, x

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
        _copy_torch_params(mha, torch_mod.module)
        x = distgrad.tensor(torch_x.detach().numpy().copy(), requires_grad=True)
        return _Callable(mha, need_weights), x

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


CASES = [
    ("transformer_encoder_layer", *_encoder_layer_case()),
    ("multihead_attention", *_mha_case()),
    ("multihead_attention_weights", *_mha_case(need_weights=True)),
]


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
    burst of load on a shared machine hits both alike."""
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
    import torch
    torch.set_num_threads(1)
    rows = []
    for name, build_distgrad, build_torch in CASES:
        if args.case and name not in args.case:
            continue
        torch_mod, torch_x = build_torch()
        dg_mod, dg_x = build_distgrad(torch_mod, torch_x)
        dg_step, torch_step = _step_fn(dg_mod, dg_x), _step_fn(torch_mod, torch_x)
        # Same numbers first: a benchmark of different computations means nothing.
        np.testing.assert_allclose(dg_step().detach().numpy(), torch_step().detach().numpy(),
                                   rtol=1e-3, atol=1e-4)
        np.testing.assert_allclose(dg_x.grad.numpy(), torch_x.grad.numpy(), rtol=1e-3, atol=1e-4)
        times = time_steps({"distgrad": dg_step, "torch": torch_step}, reps, inner=3)
        rows.append({"case": name, "distgrad_ms": times["distgrad"], "torch_ms": times["torch"],
                     "ratio": times["distgrad"] / times["torch"]})
    print(f"Layer step (forward + backward, float32, one thread), median of {reps} repetitions")
    print(f"{'case':<30}{'distgrad ms':>13}{'torch ms':>11}{'ratio':>8}")
    for r in rows:
        print(f"{r['case']:<30}{r['distgrad_ms']:>13.2f}{r['torch_ms']:>11.2f}{r['ratio']:>8.2f}")
    print(json.dumps({"benchmark": "layers", "reps": reps, "rows": rows}))


if __name__ == "__main__":
    _single_threaded_reexec()
    main()

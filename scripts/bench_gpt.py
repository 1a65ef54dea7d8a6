"""Benchmark: training steps of a small GPT, distgrad vs PyTorch eager, same weights and data.

The model is written once against the torch API and built in both libraries (the
way public example programs write a decoder-only transformer): token and position
embeddings, causal self-attention from ``masked_fill`` and ``softmax``, LayerNorm,
a GELU MLP, AdamW with weight-decay parameter groups, ``clip_grad_norm_``, and a
``DataLoader`` with worker processes. distgrad starts from PyTorch's initial
weights and sees the same batches; the losses of every step must agree to float32
tolerance before any time counts. Prints a table and one JSON line.

    python scripts/bench_gpt.py            # 20 timed steps
    python scripts/bench_gpt.py --quick    # 6 timed steps
"""
import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import time

_THREAD_VARS = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")

CONFIG = dict(vocab=96, block=64, layers=2, heads=4, embed=128, batch=16, lr=3e-4,
              weight_decay=0.1, clip=1.0)


def _single_threaded_reexec():
    """One BLAS thread for both libraries (set before NumPy loads)."""
    if all(os.environ.get(v) == "1" for v in _THREAD_VARS):
        return
    env = dict(os.environ, **{v: "1" for v in _THREAD_VARS})
    sys.exit(subprocess.call([sys.executable, *sys.argv], env=env))


def build_model(lib):
    """The GPT, written against ``lib`` (``torch`` or ``distgrad``)."""
    nn, F = lib.nn, lib.nn.functional
    c = CONFIG

    class CausalSelfAttention(nn.Module):
        def __init__(self):
            super().__init__()
            self.c_attn = nn.Linear(c["embed"], 3 * c["embed"])
            self.c_proj = nn.Linear(c["embed"], c["embed"])
            self.register_buffer("mask", lib.tril(lib.ones(c["block"], c["block"]))
                                 .view(1, 1, c["block"], c["block"]))

        def forward(self, x):
            B, T, C = x.size()
            q, k, v = self.c_attn(x).split(C, dim=2)
            h = c["heads"]
            k = k.view(B, T, h, C // h).transpose(1, 2)
            q = q.view(B, T, h, C // h).transpose(1, 2)
            v = v.view(B, T, h, C // h).transpose(1, 2)
            att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
            att = att.masked_fill(self.mask[:, :, :T, :T] == 0, float("-inf"))
            att = F.softmax(att, dim=-1)
            y = (att @ v).transpose(1, 2).contiguous().view(B, T, C)
            return self.c_proj(y)

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln_1 = nn.LayerNorm(c["embed"])
            self.attn = CausalSelfAttention()
            self.ln_2 = nn.LayerNorm(c["embed"])
            self.mlp = nn.Sequential(nn.Linear(c["embed"], 4 * c["embed"]), nn.GELU(),
                                     nn.Linear(4 * c["embed"], c["embed"]))

        def forward(self, x):
            x = x + self.attn(self.ln_1(x))
            return x + self.mlp(self.ln_2(x))

    class GPT(nn.Module):
        def __init__(self):
            super().__init__()
            self.wte = nn.Embedding(c["vocab"], c["embed"])
            self.wpe = nn.Embedding(c["block"], c["embed"])
            self.blocks = nn.ModuleList([Block() for _ in range(c["layers"])])
            self.ln_f = nn.LayerNorm(c["embed"])
            self.lm_head = nn.Linear(c["embed"], c["vocab"], bias=False)

        def forward(self, idx, targets):
            B, T = idx.size()
            pos = lib.arange(0, T, dtype=lib.long)
            x = self.wte(idx) + self.wpe(pos)
            for block in self.blocks:
                x = block(x)
            logits = self.lm_head(self.ln_f(x))
            return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))

    return GPT()


def make_optimizer(lib, model):
    """AdamW with weight decay on matrices only, as minGPT/nanoGPT group parameters."""
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    return lib.optim.AdamW([{"params": decay, "weight_decay": CONFIG["weight_decay"]},
                            {"params": no_decay, "weight_decay": 0.0}], lr=CONFIG["lr"])


class TokenWindows:
    """Random windows of a fixed token stream; item ``i`` is (x, y) shifted by one.

    A ``Dataset`` for either library: items are int64 arrays, which each library's
    default collate stacks into a tensor."""

    def __init__(self, n_items, seed=0):
        import numpy as np
        rng = np.random.default_rng(seed)
        self.stream = rng.integers(0, CONFIG["vocab"], size=20000).astype(np.int64)
        self.starts = rng.integers(0, len(self.stream) - CONFIG["block"] - 1, size=n_items)

    def __len__(self):
        return len(self.starts)

    def __getitem__(self, i):
        s = int(self.starts[i])
        chunk = self.stream[s:s + CONFIG["block"] + 1]
        return chunk[:-1].copy(), chunk[1:].copy()


def _copy_weights(ours, theirs):
    import distgrad
    ours.load_state_dict({k: distgrad.tensor(v.detach().numpy().copy())
                          for k, v in theirs.state_dict().items()})


def _trainer(lib, model, steps):
    """A step function over a DataLoader with two worker processes."""
    opt = make_optimizer(lib, model)
    data = TokenWindows(n_items=CONFIG["batch"] * steps)
    loader = lib.utils.data.DataLoader(data, batch_size=CONFIG["batch"], shuffle=False,
                                       num_workers=2)
    batches = iter(loader)
    losses = []

    def step():
        x, y = next(batches)
        loss = model(x, y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        lib.nn.utils.clip_grad_norm_(model.parameters(), CONFIG["clip"])
        opt.step()
        losses.append(float(loss.item()))
    return step, losses, batches


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer steps")
    parser.add_argument("--steps", type=int, default=None)
    args = parser.parse_args(argv)
    steps = args.steps or (6 if args.quick else 20)
    warmup = 2
    import distgrad
    try:
        import torch
        torch.set_num_threads(1)
        torch.manual_seed(0)
    except ImportError:
        torch = None
    distgrad.manual_seed(0)
    dg_model = build_model(distgrad)
    runs = {}
    if torch is not None:
        t_model = build_model(torch)
        _copy_weights(dg_model, t_model)
        runs["torch"] = _trainer(torch, t_model, steps + warmup)
    runs["distgrad"] = _trainer(distgrad, dg_model, steps + warmup)
    times = {name: [] for name in runs}
    for i in range(steps + warmup):
        for name, (step, _, _) in runs.items():  # alternate: load bursts hit both alike
            t0 = time.perf_counter()
            step()
            if i >= warmup:
                times[name].append((time.perf_counter() - t0) * 1e3)
    losses = {name: run[1] for name, run in runs.items()}
    if "torch" in losses:
        for i, (a, b) in enumerate(zip(losses["distgrad"], losses["torch"])):
            # Same weights, same batches: the losses must agree to float32 tolerance.
            assert abs(a - b) <= 2e-4 * max(1.0, abs(b)), f"step {i}: distgrad {a} torch {b}"
    row = {"steps": steps, "distgrad_ms": statistics.median(times["distgrad"]),
           "final_loss": losses["distgrad"][-1]}
    if "torch" in times:
        row["torch_ms"] = statistics.median(times["torch"])
        row["ratio"] = row["distgrad_ms"] / row["torch_ms"]
        row["max_loss_diff"] = max(abs(a - b) for a, b in zip(losses["distgrad"],
                                                              losses["torch"]))
    print(f"GPT training step ({CONFIG['layers']} layers, {CONFIG['embed']} wide, "
          f"batch {CONFIG['batch']}x{CONFIG['block']}, one thread), median of {steps} steps")
    print(f"{'distgrad ms':>12}{'torch ms':>10}{'ratio':>8}{'max loss diff':>15}")
    if "torch_ms" in row:
        print(f"{row['distgrad_ms']:>12.1f}{row['torch_ms']:>10.1f}{row['ratio']:>8.2f}"
              f"{row['max_loss_diff']:>15.2e}")
    else:
        print(f"{row['distgrad_ms']:>12.1f}{'n/a':>10}{'n/a':>8}{'n/a':>15}")
    print(json.dumps({"benchmark": "gpt", "config": CONFIG, **row}))
    for _, _, batches in runs.values():
        del batches  # the loaders' workers end with their iterators
    return 0


if __name__ == "__main__":
    import perf_page
    _single_threaded_reexec()
    with perf_page.recorded("bench_gpt"):  # with --record: its section of docs/performance.md
        sys.exit(main())

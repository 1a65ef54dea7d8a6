"""Train a small MLP on a synthetic regression task and print the loss falling.

The main job of distgrad until the multi-worker launcher lands; everything is
embedded (data, model, optimizer), so it runs with no arguments:

    python scripts/train_mlp.py
    python scripts/train_mlp.py --steps 500 --width 128 --lr 0.01
"""
import argparse
import sys
import time

import distgrad
from distgrad import nn


def make_data(n, d_in, d_out, seed):
    g = distgrad.Generator().manual_seed(seed)
    x = distgrad.randn(n, d_in, generator=g)
    true_w = distgrad.randn(d_in, d_out, generator=g)
    y = (x @ true_w).tanh() + 0.05 * distgrad.randn(n, d_out, generator=g)
    return x, y


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=300, help="optimizer steps (default 300)")
    parser.add_argument("--width", type=int, default=64, help="hidden width (default 64)")
    parser.add_argument("--batch", type=int, default=64, help="batch size (default 64)")
    parser.add_argument("--lr", type=float, default=3e-3, help="Adam learning rate (default 3e-3)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    for name in ("steps", "width", "batch"):
        if getattr(args, name) <= 0:
            parser.error(f"--{name} must be positive, got {getattr(args, name)}")

    distgrad.manual_seed(args.seed)
    x, y = make_data(1024, 16, 4, args.seed)
    model = nn.Sequential(nn.Linear(16, args.width), nn.Tanh(),
                          nn.Linear(args.width, args.width), nn.Tanh(),
                          nn.Linear(args.width, 4))
    opt = distgrad.optim.Adam(model.parameters(), lr=args.lr)
    loss_fn = nn.MSELoss()
    start = time.perf_counter()
    first = last = None
    for step in range(args.steps):
        idx = distgrad.randint(0, x.shape[0], (args.batch,))
        loss = loss_fn(model(x[idx]), y[idx])
        opt.zero_grad()
        loss.backward()
        opt.step()
        if first is None:
            first = loss.item()
        if step % max(1, args.steps // 10) == 0 or step == args.steps - 1:
            with distgrad.no_grad():
                full = loss_fn(model(x), y).item()
            last = full
            print(f"step {step:5d}  batch loss {loss.item():.5f}  full loss {full:.5f}")
    elapsed = time.perf_counter() - start
    print(f"trained {args.steps} steps in {elapsed:.2f} s; loss {first:.4f} -> {last:.4f}")
    return 0 if last < first else 1


if __name__ == "__main__":
    sys.exit(main())

"""Activation checkpointing against offloading, and against PyTorch's checkpoint.

    python scripts/bench_checkpoint.py          # configs/offload_compare.toml as it is
    python scripts/bench_checkpoint.py --batch 64 --width 64 --layers 4 --steps 2 --no-sweep

Runs the runs of an offloading experiment config (default
``configs/offload_compare.toml``: no saving, which is the floor; checkpointing whole and
selective; disk; the activation store; checkpointing with disk offloading; PyTorch
without checkpointing and with its own checkpoint, whole and selective; a sweep of
the offload size threshold and read-ahead depth) exactly as ``distgrad offload`` does:
one process per run, one BLAS thread each, steps taken in turns (a machine that gets
busier slows every run alike), medians over the steps, the slowdown the median of
per-round ratios. Without PyTorch its runs are left out. Prints the table, the verdict
(which run meets the config's target, what wins at each amount of memory) and ONE
JSON line with every row.
"""
import argparse
import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from distgrad.offload.experiment.config import load_config  # noqa: E402
from distgrad.offload.experiment.report import print_report, rows  # noqa: E402
from distgrad.offload.experiment.runner import run_experiment  # noqa: E402


def _torch_available():
    try:
        import torch  # noqa: F401
    except ImportError:
        return False
    return True


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config", default=os.path.join(ROOT, "configs", "offload_compare.toml"))
    p.add_argument("--batch", type=int)
    p.add_argument("--width", type=int)
    p.add_argument("--layers", type=int)
    p.add_argument("--steps", type=int)
    p.add_argument("--no-sweep", action="store_true", help="leave the sweep's runs out")
    args = p.parse_args(argv)
    config = load_config(args.config)
    for key in ("batch", "width", "layers"):
        if getattr(args, key) is not None:
            config["model"][key] = getattr(args, key)
    if args.steps is not None:
        config["experiment"]["steps"] = args.steps
    torch = _torch_available()
    config["run"] = [r for r in config["run"]
                     if (torch or r.get("framework") != "torch")
                     and not (args.no_sweep and "sweep" in r)]
    if not torch:
        print("PyTorch is not installed: its runs are left out")
    results = run_experiment(config)
    table = rows(config, results)
    lines = print_report(config, table)
    print(json.dumps({"bench": "checkpoint", "model": config["model"],
                      "steps": config["experiment"]["steps"], "torch": torch,
                      "rows": [{k: v for k, v in r.items() if k != "sweep"} for r in table],
                      "verdict": lines}))
    return 0 if all("error" not in r for r in table) else 1


if __name__ == "__main__":
    sys.exit(main())

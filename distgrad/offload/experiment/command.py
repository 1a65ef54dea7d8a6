"""``distgrad offload CONFIG``: compare activation-offloading setups on one model.

    distgrad offload configs/offload_mlp.toml                 # table, results.json, plots
    distgrad offload configs/offload_wide.toml --out /tmp/wide
    distgrad offload configs/offload_mlp.toml --check         # check the config, run nothing
    distgrad offload --help-config                            # every key, its default and meaning

Exit status: 0 when every run was measured; 1 when a run's process failed (the
table says which and why); 2 for a config or command-line error (nothing was
started).
"""
import argparse
import json
import os
import sys
import time

from distgrad.utils.cli import PrintAndExit

from .config import ExperimentConfigError, describe, load_config

__all__ = ["HELP", "add_arguments", "run", "main"]

HELP = ("compare ways to save activation memory (no offloading, disk, store, tiered, "
        "activation checkpointing whole or selective, both combined, PyTorch's checkpoint) "
        "on one model: step time, activation and peak memory, bytes moved, from a TOML config")

EPILOG = """\
Each [[run]] of the config runs in a fresh process: one warm-up step, then
experiment.steps measured ones, the processes taking turns step by step. Printed: a
table (Pareto fronts marked) and a verdict (which run meets experiment.target_memory
at experiment.target_slowdown, and what wins at each amount of memory). Written to
the output directory: results.json (every measurement and memory timeline) and, with
matplotlib (pip install 'distgrad[offload]'), memory.png and tradeoff.png. Activation
memory is the RSS held when the forward is done above the RSS before the step; peak
memory is the process's peak RSS during a step above its RSS just before it.

examples:
  distgrad offload configs/offload_compare.toml        # every method, PyTorch, a sweep
  distgrad offload configs/offload_mlp.toml
  distgrad offload configs/offload_mlp.toml --out /tmp/mlp --check
  distgrad offload --help-config
"""


def add_arguments(p):
    p.epilog = EPILOG
    p.formatter_class = argparse.RawDescriptionHelpFormatter
    p.add_argument("config", help="the experiment's TOML config (see configs/offload_*.toml "
                                  "and --help-config)")
    p.add_argument("--out", metavar="DIR",
                   help="where results.json and the plots go (default: runs/<experiment.name>)")
    p.add_argument("--no-progress", action="store_true",
                   help="no progress bar (default: a tqdm bar when tqdm is installed, a line "
                        "per round otherwise)")
    p.add_argument("--no-plot", action="store_true",
                   help="skip memory.png and tradeoff.png (default: written when matplotlib "
                        "is installed)")
    p.add_argument("--check", action="store_true",
                   help="check the config and print it with its defaults; start nothing")
    p.add_argument("--help-config", action=PrintAndExit, lines=describe,
                   help="list every config key with its meaning and default, and exit")
    return p


def _progress(enabled):
    def plain(rounds, name):
        for i, item in enumerate(rounds):
            print(f"{name}: round {i + 1} of {len(rounds)}", file=sys.stderr, flush=True)
            yield item

    def wrap(name):
        if not enabled:
            return iter
        try:
            from tqdm import tqdm
        except ImportError:
            return lambda rounds: plain(rounds, name)
        return lambda rounds: tqdm(rounds, desc=name, unit="round", file=sys.stderr)
    return wrap


def run(args, parser=None):
    from .report import plot, print_report, rows, write_json
    from .runner import run_experiment
    try:
        config = load_config(args.config)
    except ExperimentConfigError as e:
        print(f"distgrad offload: error: {e}", file=sys.stderr)
        return 2
    if args.check:
        print(json.dumps(config, indent=2))
        return 0
    name = config["experiment"]["name"]
    out_dir = args.out or os.path.join("runs", name)
    os.makedirs(out_dir, exist_ok=True)
    print(f"offload | {len(config['run'])} runs, each in a process of its own (they warm up "
          f"together), then {config['experiment']['steps']} measured steps each", flush=True)
    t0 = time.perf_counter()
    results = run_experiment(config, _progress(not args.no_progress)(name))
    table = rows(config, results)
    lines = print_report(config, table)
    pngs, note = ([], None) if args.no_plot else plot(config, results, table, out_dir)
    json_path = os.path.join(out_dir, "results.json")
    write_json(json_path, config, results, table, time.perf_counter() - t0, lines)
    print(f"\nwrote {json_path}" + "".join(f", {p}" for p in pngs) + (f"; {note}" if note
                                                                         else ""))
    return 0 if all("error" not in r for r in table) else 1


def main(argv=None):
    parser = add_arguments(argparse.ArgumentParser(prog="distgrad offload", description=HELP))
    return run(parser.parse_args(argv), parser)


if __name__ == "__main__":
    sys.exit(main())

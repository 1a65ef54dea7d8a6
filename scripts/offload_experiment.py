"""Activation-offloading experiment: one model under several offloading runs.

    python scripts/offload_experiment.py --config configs/offload_mlp.toml [--out DIR]

Each ``[[run]]`` of the config (no offloading, disk, disk above a size threshold,
the activation store, tiered, ...) runs in a fresh process of its own: one
warm-up step, then ``steps`` measured forward+backward steps, the processes
taking turns step by step (so a machine that gets busier slows every run alike).
Written to the output directory:

* a table on stdout: step time; slowdown against the run named in
  ``[experiment] baseline`` (the median of the per-round ratios); peak memory
  and its ratio; bytes offloaded; dedup savings; I/O wait in forward and backward;
* ``results.json``: the same, with per-step values and the memory timelines;
* ``memory.png`` (RSS over the last step, per run) and ``tradeoff.png`` (step time
  against memory saved), if matplotlib is installed (``pip install
  'distgrad[offload]'``).

Peak memory is the process's peak resident set during a step minus its resident
set just before it (the kernel's high-water mark, reset per step): everything
the process holds counts, nothing is estimated. Runs whose ``kind`` is
``remote`` (or ``tiered`` with ``store = "local"``) use an activation store this
script starts (``[store]``) and stops. A progress bar shows if tqdm is installed.
"""
import argparse
import json
import os
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from distgrad.offload.config import check_config  # noqa: E402
from distgrad.offload.harness import Lockstep, serve_training, slowdown  # noqa: E402
from distgrad.offload.policy import load_toml_table  # noqa: E402

SECTIONS = {
    "experiment": {"name": str, "steps": int, "baseline": str, "timeline_interval": float},
    "model": {"batch": int, "width": int, "layers": int, "activation": str, "seed": int},
    "store": {"memory_bytes": (int, str), "bind": str},
}
DEFAULTS = {
    "experiment": {"name": "offload", "steps": 3, "baseline": "none", "timeline_interval": 0.005},
    "model": {"activation": "tanh", "seed": 0},
    "store": {"memory_bytes": "4G", "bind": "ipc"},
}
ACTIVATIONS = ("tanh", "relu", "gelu", "sigmoid")


# ---------------------------------------------------------------- the config
def load_config(path):
    """The validated config; errors name the key and the file."""
    data = load_toml_table(path)
    for key in data:
        if key not in SECTIONS and key != "run":
            raise ValueError(f"{path}: unknown table [{key}] (known: "
                             f"{', '.join(list(SECTIONS) + ['[run]'])})")
    config = {}
    for section, types in SECTIONS.items():
        table = data.get(section, {})
        if not isinstance(table, dict):
            raise ValueError(f"{path}: [{section}] must be a table")
        for key, value in table.items():
            if key not in types:
                raise ValueError(f"{path}: unknown key {key!r} in [{section}] "
                                 f"(known: {', '.join(types)})")
            want = types[key]
            if isinstance(value, bool) or not isinstance(value, want):
                if not (want is float and isinstance(value, int) and not isinstance(value, bool)):
                    raise ValueError(f"{path}: [{section}] {key} must be "
                                     f"{getattr(want, '__name__', 'an int or a size string')}, "
                                     f"got {value!r}")
        config[section] = dict(DEFAULTS.get(section, {}), **table)
    model = config["model"]
    for key in ("batch", "width", "layers"):
        if key not in model:
            raise ValueError(f"{path}: [model] needs key {key!r}")
        if model[key] < 1:
            raise ValueError(f"{path}: [model] {key} must be >= 1, got {model[key]}")
    if model["activation"] not in ACTIVATIONS:
        raise ValueError(f"{path}: [model] activation must be one of {', '.join(ACTIVATIONS)}, "
                         f"got {model['activation']!r}")
    if config["experiment"]["steps"] < 1:
        raise ValueError(f"{path}: [experiment] steps must be >= 1")
    if config["store"]["bind"] not in ("ipc", "tcp"):
        raise ValueError(f"{path}: [store] bind must be 'ipc' or 'tcp'")
    runs = data.get("run")
    if not isinstance(runs, list) or not runs:
        raise ValueError(f"{path}: no [[run]] tables (each names one offloading setup)")
    names = set()
    for i, run in enumerate(runs):
        where = f"{path} [[run]] #{i + 1}"
        if not isinstance(run.get("name"), str):
            raise ValueError(f"{where}: needs key 'name' (a string)")
        if run["name"] in names:
            raise ValueError(f"{where}: name {run['name']!r} is used twice")
        names.add(run["name"])
        _check_run(run, f"{path} [[run]] {run['name']!r}")
    if config["experiment"]["baseline"] not in names:
        raise ValueError(f"{path}: [experiment] baseline {config['experiment']['baseline']!r} "
                         "is not the name of a [[run]]")
    config["run"] = runs
    return config


def _check_run(run, where):
    """Validate a run's offload table as the child will use it (no store is opened here)."""
    table = {k: v for k, v in run.items() if k != "name"}
    kind, _ = check_config(table, where)
    if kind == "remote" and not isinstance(table.get("store", "local"), str):
        raise ValueError(f"{where}: key 'store' must be \"local\" or an endpoint")


def _run_store(run, endpoint):
    """The store a run uses: the script's own for ``remote`` / ``store = "local"``."""
    if run.get("kind") == "remote" and run.get("store", "local") == "local":
        return endpoint
    if run.get("kind") == "tiered" and run.get("store") == "local":
        return endpoint
    return None


# ---------------------------------------------------------------- one run (child)
def child(config, index, endpoint):
    import distgrad
    from distgrad import nn
    from distgrad.offload import hooks_from_config
    m = config["model"]
    run = config["run"][index]
    distgrad.manual_seed(m["seed"])
    act = {"tanh": nn.Tanh, "relu": nn.ReLU, "gelu": nn.GELU, "sigmoid": nn.Sigmoid}[
        m["activation"]]
    model = nn.Sequential(*[layer for _ in range(m["layers"])
                            for layer in (nn.Linear(m["width"], m["width"]), act())])
    x = distgrad.randn(m["batch"], m["width"])
    table = {k: v for k, v in run.items() if k != "name"}
    store = _run_store(run, endpoint)
    if store is not None:
        table.pop("store", None)
    hooks = hooks_from_config(table, f"run {run['name']!r}", model=model, store=store)
    serve_training(model, x, hooks, config["experiment"]["timeline_interval"])


# ---------------------------------------------------------------- the experiment (parent)
def child_argv(config_path, index, endpoint):
    cmd = [sys.executable, os.path.abspath(__file__), "--config", config_path,
           "--child", str(index)]
    if endpoint:
        cmd += ["--store", endpoint]
    return cmd


def _progress(items, desc):
    try:
        from tqdm import tqdm
    except ImportError:
        print("note: install tqdm for a progress bar (pip install 'distgrad[offload]')",
              file=sys.stderr)
        return _plain_progress(items, desc)
    return tqdm(items, desc=desc, unit="round", file=sys.stderr)


def _plain_progress(items, desc):
    for i, item in enumerate(items):
        print(f"{desc}: round {i + 1} of {len(items)}", file=sys.stderr, flush=True)
        yield item


def table(config, results):
    base = results[config["experiment"]["baseline"]]
    rows = []
    for run in config["run"]:
        r = results[run["name"]]
        if "error" in r:
            rows.append({"run": run["name"], "error": r["error"]})
            continue
        s = r["stats"] or {}
        rows.append({
            "run": run["name"], "step_s": r["step_s"],
            "slowdown": slowdown(r, base),
            "peak_bytes": r["peak_bytes"],
            "peak_ratio": r["peak_bytes"] / base["peak_bytes"]
            if base.get("peak_bytes") else None,
            "bytes_offloaded": s.get("bytes_offloaded", 0),
            "bytes_deduplicated": s.get("bytes_deduplicated", 0),
            "forward_wait_s": s.get("forward_wait_s", 0.0),
            "backward_wait_s": s.get("backward_wait_s", 0.0)})
    return rows


def print_table(config, rows):
    m = config["model"]
    print(f"\n{config['experiment']['name']}: B{m['batch']}-D{m['width']}-L{m['layers']} "
          f"{m['activation']} MLP, float32, median of {config['experiment']['steps']} steps "
          "(peak memory = the process's peak RSS during a step above its RSS before it)")
    head = (f"{'run':<24}{'step s':>8}{'slowdown':>10}{'peak MiB':>10}{'peak ratio':>11}"
            f"{'offl MiB':>10}{'dedup MiB':>10}{'fwd wait s':>11}{'bwd wait s':>11}")
    print(head)
    print("-" * len(head))
    mib = 1 << 20
    for r in rows:
        if "error" in r:
            print(f"{r['run']:<24} failed: {r['error']}")
            continue
        print(f"{r['run']:<24}{r['step_s']:>8.2f}{r['slowdown']:>9.2f}x"
              f"{r['peak_bytes'] / mib:>10.1f}{r['peak_ratio']:>10.0%} "
              f"{r['bytes_offloaded'] / mib:>10.1f}{r['bytes_deduplicated'] / mib:>10.1f}"
              f"{r['forward_wait_s']:>11.3f}{r['backward_wait_s']:>11.3f}")


def plot(config, results, rows, out_dir):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("note: install matplotlib for the plots (pip install 'distgrad[offload]')")
        return []
    mib = 1 << 20
    fig, ax = plt.subplots(figsize=(8, 4.5))
    for run in config["run"]:
        tl = results[run["name"]].get("timeline")
        if tl:
            ax.plot([t for t, _ in tl], [b / mib for _, b in tl], label=run["name"])
    ax.set_xlabel("time in the step (s)")
    ax.set_ylabel("RSS above the step's start (MiB)")
    ax.set_title(f"{config['experiment']['name']}: memory over one step")
    ax.legend()
    fig.tight_layout()
    memory_png = os.path.join(out_dir, "memory.png")
    fig.savefig(memory_png, dpi=120)
    plt.close(fig)

    base = results[config["experiment"]["baseline"]]
    fig, ax = plt.subplots(figsize=(6, 4.5))
    for r in rows:
        if "error" in r:
            continue
        saved = (base["peak_bytes"] - r["peak_bytes"]) / mib
        ax.scatter([saved], [r["step_s"]])
        ax.annotate(r["run"], (saved, r["step_s"]), textcoords="offset points", xytext=(4, 4))
    ax.set_xlabel(f"peak memory saved against {config['experiment']['baseline']!r} (MiB)")
    ax.set_ylabel("step time (s)")
    ax.set_title(f"{config['experiment']['name']}: step time vs memory saved")
    fig.tight_layout()
    tradeoff_png = os.path.join(out_dir, "tradeoff.png")
    fig.savefig(tradeoff_png, dpi=120)
    plt.close(fig)
    return [memory_png, tradeoff_png]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", required=True, help="the experiment's TOML file")
    ap.add_argument("--out", help="output directory (default: runs/<experiment name>)")
    ap.add_argument("--child", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--store", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    try:
        config = load_config(args.config)
    except (OSError, ValueError) as e:
        print(f"offload_experiment: {e}", file=sys.stderr)
        return 2
    if args.child is not None:
        child(config, args.child, args.store)
        return 0

    out_dir = args.out or os.path.join("runs", config["experiment"]["name"])
    os.makedirs(out_dir, exist_ok=True)
    needs_store = any(_run_store(run, "x") for run in config["run"])
    env = {"PYTHONPATH": os.pathsep.join(p for p in (ROOT, os.environ.get("PYTHONPATH")) if p)}
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="offload-experiment-") as tmp:
        from contextlib import nullcontext
        from distgrad.offload.store.command import spawn_store
        st = config["store"]
        bind = f"ipc://{tmp}/store.sock" if st["bind"] == "ipc" else "tcp://127.0.0.1:0"
        store_cm = spawn_store("--bind", bind, "--memory-bytes", st["memory_bytes"]) \
            if needs_store else nullcontext((None, None))
        with store_cm as (endpoint, _):
            argvs = {run["name"]: child_argv(args.config, i,
                                             endpoint if _run_store(run, endpoint) else None)
                     for i, run in enumerate(config["run"])}
            print(f"starting {len(argvs)} processes (they warm up together)", file=sys.stderr)
            with Lockstep(argvs, env=env) as lockstep:
                for _ in _progress(range(config["experiment"]["steps"]),
                                   config["experiment"]["name"]):
                    lockstep.round()
                results = lockstep.summary()
                for name, final in lockstep.finish().items():
                    results[name]["stats"] = final.get("stats")
    rows = table(config, results)
    print_table(config, rows)
    pngs = plot(config, results, rows, out_dir)
    json_path = os.path.join(out_dir, "results.json")
    with open(json_path, "w") as f:
        json.dump({"config": {k: v for k, v in config.items()}, "rows": rows,
                   "results": results, "seconds": time.perf_counter() - t0,
                   "peak_memory": "process peak RSS during a step above its RSS before it"},
                  f, indent=1)
    print(f"\nwrote {json_path}" + "".join(f", {p}" for p in pngs))
    return 0 if all("error" not in r for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())

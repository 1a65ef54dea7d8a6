"""What an experiment reports: a table on stdout, ``results.json``, and two plots.

Per run: step time; slowdown against ``experiment.baseline`` (the median of the
per-round ratios); peak memory and its ratio to the baseline's; bytes offloaded;
bytes deduplicated; I/O waits in forward and backward. ``memory.png`` is each run's
RSS over its last step, ``tradeoff.png`` step time against memory saved (with
matplotlib: ``pip install 'distgrad[offload]'``).
"""
import json
import os

from ..harness import slowdown

__all__ = ["rows", "print_table", "plot", "write_json"]

_MIB = 1 << 20
PEAK_MEMORY = "process peak RSS during a step above its RSS before it"


def rows(config, results):
    """One dict per run (``{"run", "error"}`` for a run whose process failed)."""
    base = results[config["experiment"]["baseline"]]
    out = []
    for run in config["run"]:
        r = results[run["name"]]
        if "error" in r:
            out.append({"run": run["name"], "error": r["error"]})
            continue
        s = r["stats"] or {}
        out.append({
            "run": run["name"], "step_s": r["step_s"], "slowdown": slowdown(r, base),
            "peak_bytes": r["peak_bytes"],
            "peak_ratio": r["peak_bytes"] / base["peak_bytes"] if base.get("peak_bytes")
            else None,
            "bytes_offloaded": s.get("bytes_offloaded", 0),
            "bytes_deduplicated": s.get("bytes_deduplicated", 0),
            "forward_wait_s": s.get("forward_wait_s", 0.0),
            "backward_wait_s": s.get("backward_wait_s", 0.0)})
    return out


def _ratio(value, spec, missing="n/a"):
    return format(value, spec) if value is not None else missing


def print_table(config, table):
    m = config["model"]
    print(f"\n{config['experiment']['name']}: B{m['batch']}-D{m['width']}-L{m['layers']} "
          f"{m['activation']} MLP, float32, median of {config['experiment']['steps']} steps "
          f"(peak memory = the {PEAK_MEMORY})")
    head = (f"{'run':<24}{'step s':>8}{'slowdown':>10}{'peak MiB':>10}{'peak ratio':>11}"
            f"{'offl MiB':>10}{'dedup MiB':>10}{'fwd wait s':>11}{'bwd wait s':>11}")
    print(head)
    print("-" * len(head))
    for r in table:
        if "error" in r:
            print(f"{r['run']:<24} failed: {r['error']}")
            continue
        print(f"{r['run']:<24}{r['step_s']:>8.2f}{_ratio(r['slowdown'], '>9.2f')}x"
              f"{r['peak_bytes'] / _MIB:>10.1f}{_ratio(r['peak_ratio'], '>10.0%')} "
              f"{r['bytes_offloaded'] / _MIB:>10.1f}{r['bytes_deduplicated'] / _MIB:>10.1f}"
              f"{r['forward_wait_s']:>11.3f}{r['backward_wait_s']:>11.3f}")


def write_json(path, config, results, table, seconds):
    with open(path, "w", encoding="utf-8") as f:
        json.dump({"config": config, "rows": table, "results": results, "seconds": seconds,
                   "peak_memory": PEAK_MEMORY}, f, indent=1)


def plot(config, results, table, out_dir):
    """The paths of ``memory.png`` and ``tradeoff.png`` in ``out_dir``, or a note why none."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return [], "no plots: matplotlib is not installed (pip install 'distgrad[offload]')"
    name = config["experiment"]["name"]
    fig, ax = plt.subplots(figsize=(8, 4.5))
    for run in config["run"]:
        timeline = results[run["name"]].get("timeline")
        if timeline:
            ax.plot([t for t, _ in timeline], [b / _MIB for _, b in timeline], label=run["name"])
    ax.set_xlabel("time in the step (s)")
    ax.set_ylabel("RSS above the step's start (MiB)")
    ax.set_title(f"{name}: memory over one step")
    ax.legend()
    fig.tight_layout()
    memory_png = os.path.join(out_dir, "memory.png")
    fig.savefig(memory_png, dpi=120)
    plt.close(fig)

    base = results[config["experiment"]["baseline"]]
    fig, ax = plt.subplots(figsize=(6, 4.5))
    for r in table:
        if "error" in r or "error" in base:
            continue
        saved = (base["peak_bytes"] - r["peak_bytes"]) / _MIB
        ax.scatter([saved], [r["step_s"]])
        ax.annotate(r["run"], (saved, r["step_s"]), textcoords="offset points", xytext=(4, 4))
    ax.set_xlabel(f"peak memory saved against {config['experiment']['baseline']!r} (MiB)")
    ax.set_ylabel("step time (s)")
    ax.set_title(f"{name}: step time vs memory saved")
    fig.tight_layout()
    tradeoff_png = os.path.join(out_dir, "tradeoff.png")
    fig.savefig(tradeoff_png, dpi=120)
    plt.close(fig)
    return [memory_png, tradeoff_png], None

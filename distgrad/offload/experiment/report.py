"""What an experiment reports: a table and a verdict on stdout, ``results.json``, plots.

Per run: step time (wall time less what the step's thread waited for a core, where the
kernel keeps scheduler statistics: on a shared machine other processes' load would
otherwise be most of it; the wall time too); slowdown against ``experiment.baseline``
(the median of the per-round ratios); CPU time of the step (the process's, all threads:
what the step costs a machine with no core to spare); activation memory (the RSS held
when the forward is done, above the step's start: what the step keeps for backward) and
its ratio to the baseline's; peak memory and its ratio; bytes moved out of the process
and back (offloading); I/O waits in forward and backward. A distgrad run on the Pareto
front of activation memory against slowdown (no other is both smaller and faster;
PyTorch's runs are the reference, not candidates) is marked ``a``, of peak memory
against slowdown ``p``. The verdict names, with numbers, the runs that meet the
experiment's target and what wins at each amount of memory. ``memory.png`` is each run's
RSS over its last step, ``tradeoff.png`` memory against step time with both Pareto
fronts (with matplotlib: ``pip install 'distgrad[offload]'``).
"""
import json
import os

from ..harness import slowdown

__all__ = ["rows", "print_table", "verdict", "print_report", "plot", "write_json", "pareto",
           "STEP_TIME"]

_MIB = 1 << 20
PEAK_MEMORY = "process peak RSS during a step above its RSS before it"
STEP_TIME = ("wall time less what the step's thread waited for a core (other processes' "
             "load)")
ACTIVATION_MEMORY = "RSS held when the forward is done above the RSS before the step"


def _method(run):
    parts = [run.get("framework", "distgrad")]
    if run.get("checkpoint", "none") != "none":
        parts.append(f"checkpoint {run['checkpoint']}")
    kind = run.get("kind", "disk")
    if kind != "none":
        parts.append(f"offload {kind}")
    return ", ".join(parts)


def _ours(r):
    """A distgrad run (PyTorch's runs are the reference, not candidates)."""
    return "error" not in r and r["method"].startswith("distgrad")


def pareto(table, memory):
    """Names of the distgrad runs no other beats on both ``memory`` (a row key) and
    slowdown."""
    ok = [r for r in table if _ours(r) and r.get(memory) is not None
          and r.get("slowdown") is not None]
    return {r["run"] for r in ok
            if not any(o[memory] <= r[memory] and o["slowdown"] <= r["slowdown"]
                       and (o[memory] < r[memory] or o["slowdown"] < r["slowdown"])
                       for o in ok)}


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
        act, base_act = r.get("forward_bytes"), base.get("forward_bytes")
        own = "own_steps_s" in r and "own_steps_s" in base  # waits for a core left out
        out.append({
            "run": run["name"], "method": _method(run), "sweep": run.get("sweep"),
            "step_s": r["own_step_s"] if own else r["step_s"], "wall_s": r["step_s"],
            "step_time": STEP_TIME if own else "wall time",
            "slowdown": slowdown(r, base, "own_steps_s" if own else "steps_s"),
            "cpu_s": r.get("cpu_s"),
            "forward_bytes": act,
            "act_ratio": act / base_act if act is not None and base_act else None,
            "peak_bytes": r["peak_bytes"],
            "peak_ratio": r["peak_bytes"] / base["peak_bytes"] if base.get("peak_bytes")
            else None,
            "bytes_offloaded": s.get("bytes_offloaded", 0),
            "bytes_moved": s.get("bytes_offloaded", 0) + s.get("bytes_read", 0),
            "bytes_deduplicated": s.get("bytes_deduplicated", 0),
            "forward_wait_s": s.get("forward_wait_s", 0.0),
            "backward_wait_s": s.get("backward_wait_s", 0.0)})
    act_front, peak_front = pareto(out, "act_ratio"), pareto(out, "peak_ratio")
    for r in out:
        if "error" not in r:
            r["front"] = ("a" if r["run"] in act_front else "") + \
                         ("p" if r["run"] in peak_front else "")
    return out


def _ratio(value, spec, missing="n/a"):
    return format(value, spec) if value is not None else missing


def print_table(config, table):
    m = config["model"]
    timed = next((r["step_time"] for r in table if "error" not in r), STEP_TIME)
    print(f"\n{config['experiment']['name']}: B{m['batch']}-D{m['width']}-L{m['layers']} "
          f"{m['activation']} MLP, float32, median of {config['experiment']['steps']} steps. "
          f"step s: {timed}; slowdown: the median of its per-round ratios to "
          f"{config['experiment']['baseline']!r}'s; wall s: as measured; cpu s: all the "
          f"process's threads; act: {ACTIVATION_MEMORY}; peak: the {PEAK_MEMORY}; moved: "
          "offloaded and read back; front: on distgrad's Pareto front of activation (a) or peak "
          "(p) memory against slowdown")
    width = max([24] + [len(r["run"]) + 1 for r in table])
    head = (f"{'run':<{width}}{'step s':>7}{'slowdown':>9}{'wall s':>7}{'cpu s':>6}"
            f"{'act MiB':>8}{'act %':>6}{'peak MiB':>9}{'peak %':>7}{'moved MiB':>10}"
            f"{'bwd wait':>9}{'front':>6}")
    print(head)
    print("-" * len(head))
    for r in table:
        if "error" in r:
            print(f"{r['run']:<{width}} failed: {r['error']}")
            continue
        act = r["forward_bytes"]
        print(f"{r['run']:<{width}}{r['step_s']:>7.2f}{_ratio(r['slowdown'], '>8.2f')}x"
              f"{r['wall_s']:>7.2f}{_ratio(r['cpu_s'], '>6.2f')}"
              f"{_ratio(act / _MIB if act is not None else None, '>8.1f')}"
              f"{_ratio(r['act_ratio'], '>6.0%')}{r['peak_bytes'] / _MIB:>9.1f}"
              f"{_ratio(r['peak_ratio'], '>7.0%')}{r['bytes_moved'] / _MIB:>10.1f}"
              f"{r['backward_wait_s']:>9.3f}{r['front']:>6}")


def _describe(r):
    return (f"{r['run']} ({_ratio(r['act_ratio'], '.0%')} of the activation memory, "
            f"{_ratio(r['peak_ratio'], '.0%')} of the peak, "
            f"{_ratio(r['slowdown'], '.2f')}x the step time)")


def verdict(config, table):
    """Lines saying which run wins where: the target, then the fronts, fastest first."""
    e = config["experiment"]
    ok = [r for r in table if _ours(r) and r["slowdown"] is not None
          and r["act_ratio"] is not None]
    lines = []
    target = f"at most {e['target_memory']:.0%} of {e['baseline']!r}'s activation memory " \
             f"for at most {e['target_slowdown']:.2f}x its step time"
    met = sorted((r for r in ok if r["act_ratio"] <= e["target_memory"]
                  and r["slowdown"] <= e["target_slowdown"]), key=lambda r: r["slowdown"])
    if met:
        lines.append(f"target ({target}): met by " + "; ".join(_describe(r) for r in met))
    else:
        under = sorted((r for r in ok if r["act_ratio"] <= e["target_memory"]),
                       key=lambda r: r["slowdown"])
        closest = f"; the fastest under the memory target: {_describe(under[0])}" if under \
            else ""
        lines.append(f"target ({target}): not met{closest}")
    for key, what in (("act_ratio", "activation memory"), ("peak_ratio", "peak memory")):
        front = sorted((r for r in ok if r["run"] in pareto(ok, key)), key=lambda r: r[key])
        lines.append(f"wins on {what} against time (the Pareto front, least memory first): "
                     + "; ".join(_describe(r) for r in front))
    theirs = [r for r in table if "error" not in r and r["method"].startswith("torch")]
    for r in ok:
        twin = next((o for o in theirs if not r["sweep"] and o["method"] ==
                     r["method"].replace("distgrad", "torch", 1)), None)
        if twin is not None:  # times as ratios of per-round ratios: load cancels out
            act = _safe_div(r["forward_bytes"], twin["forward_bytes"])
            peak = _safe_div(r["peak_bytes"], twin["peak_bytes"])
            lines.append(f"distgrad's {r['run']!r} against PyTorch's {twin['run']!r}: step "
                         f"time {r['slowdown'] / twin['slowdown']:.2f}x, CPU time "
                         f"{_ratio(_safe_div(r['cpu_s'], twin['cpu_s']), '.2f')}x, activation "
                         f"memory {_ratio(act, '.2f')}x, peak {_ratio(peak, '.2f')}x")
    return lines


def print_report(config, table):
    """Print the table, then the verdict as a list; returns the verdict's lines."""
    print_table(config, table)
    lines = verdict(config, table)
    print()
    for line in lines:
        print(f"- {line}")
    return lines


def _safe_div(a, b):
    return a / b if a is not None and b else None


def write_json(path, config, results, table, seconds, lines=()):
    with open(path, "w", encoding="utf-8") as f:
        json.dump({"config": config, "rows": table, "verdict": list(lines), "results": results,
                   "seconds": seconds, "peak_memory": PEAK_MEMORY,
                   "activation_memory": ACTIVATION_MEMORY, "step_time": STEP_TIME}, f,
                  indent=1)


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
    ax.legend(fontsize="small")
    fig.tight_layout()
    memory_png = os.path.join(out_dir, "memory.png")
    fig.savefig(memory_png, dpi=120)
    plt.close(fig)

    ok = [r for r in table if "error" not in r and r["slowdown"] is not None]
    fig, axes = plt.subplots(1, 2, figsize=(12, 5))
    for ax, key, label in ((axes[0], "forward_bytes", "activation memory (MiB, held when "
                                                      "the forward is done)"),
                           (axes[1], "peak_bytes", "peak memory (MiB, during the step)")):
        points = [r for r in ok if r.get(key) is not None]
        front_names = pareto(points, key)
        front = sorted((r for r in points if r["run"] in front_names), key=lambda r: r[key])
        labelled = set()
        for r in points:
            on = r["run"] in front_names
            kind = "front" if on else "distgrad" if _ours(r) else "PyTorch"
            ax.scatter([r[key] / _MIB], [r["slowdown"]],
                       marker={"front": "o", "distgrad": "x", "PyTorch": "^"}[kind],
                       color={"front": "C3", "distgrad": "C0", "PyTorch": "C7"}[kind],
                       label=None if kind in labelled or kind == "front" else kind)
            labelled.add(kind)
            ax.annotate(r["run"], (r[key] / _MIB, r["slowdown"]), textcoords="offset points",
                        xytext=(4, 4), fontsize="x-small")
        if front:
            ax.step([r[key] / _MIB for r in front], [r["slowdown"] for r in front],
                    where="post", color="C3", label="distgrad's Pareto front")
        ax.legend(fontsize="x-small", loc="upper right")
        ax.set_xlabel(label)
        ax.set_ylabel(f"step time / {config['experiment']['baseline']!r}'s (median per round)")
    fig.suptitle(f"{name}: memory against step time")
    fig.tight_layout()
    tradeoff_png = os.path.join(out_dir, "tradeoff.png")
    fig.savefig(tradeoff_png, dpi=120)
    plt.close(fig)
    return [memory_png, tradeoff_png], None

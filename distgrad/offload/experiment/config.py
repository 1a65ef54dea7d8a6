"""The TOML file of an offloading experiment: its keys, their defaults, their checks.

    [experiment]   name, steps, baseline, timeline_interval, the target to report on
    [model]        batch, width, layers, activation, seed (a tanh/relu/... MLP)
    [store]        memory_bytes, bind (the activation store started for "remote" runs)
    [[run]]        name; checkpoint ("none", "full", "selective") and segments;
                   framework ("distgrad", or "torch": the same model in PyTorch); then an
                   offload table (kind = "none", "disk", "remote" or "tiered", its keys and
                   an optional [run.policy]); store = "local" is the store the experiment
                   starts
    [sweep]        run, min_bytes, prefetch_bytes: more runs, each the named run with one
                   of these values changed

Every mistake raises :class:`ExperimentConfigError`, naming the file and the key
(``[[run]]`` entries by their name), before any process starts.

>>> describe()[0]
'[experiment]'
"""
import os

from ..config import check_config, describe as describe_offload
from ..policy import load_toml_table
from ..store.command import parse_bytes
from .methods import CHECKPOINTS, FRAMEWORKS

__all__ = ["ExperimentConfigError", "load_config", "describe", "SCHEMA", "ACTIVATIONS",
           "RUN_KEYS", "SWEEP_KEYS", "offload_table", "uses_local_store"]

ACTIVATIONS = ("tanh", "relu", "gelu", "sigmoid")
_REQUIRED = object()

#: table -> key -> (type, default or _REQUIRED, meaning)
SCHEMA = {
    "experiment": {
        "name": (str, "offload", "names the output directory, runs/<name>, and the table"),
        "steps": (int, 3, "measured steps per run, after one warm-up step; the table shows "
                          "medians"),
        "baseline": (str, "none", "the [[run]] whose step time and peak memory the others' "
                                  "slowdown and peak ratio are relative to"),
        "timeline_interval": (float, 0.005, "seconds between the RSS samples of memory.png"),
        "target_memory": (float, 0.15, "the report names the runs that keep at most this "
                                       "share of the baseline's activation memory..."),
        "target_slowdown": (float, 1.05, "...at most this many times its step time"),
    },
    "model": {
        "batch": (int, _REQUIRED, "rows of the input"),
        "width": (int, _REQUIRED, "features in and out of every Linear layer"),
        "layers": (int, _REQUIRED, "Linear + activation pairs, float32"),
        "activation": (str, "tanh", " or ".join(ACTIVATIONS)),
        "seed": (int, 0, "seeds the parameters and the input"),
    },
    "store": {
        "memory_bytes": ("bytes", "4G", "what the activation store started for store = "
                                        "\"local\" holds in memory before spilling to disk "
                                        "(K/M/G suffixes)"),
        "bind": (str, "ipc", "\"ipc\" (a socket file: fastest on one machine) or \"tcp\""),
    },
}
#: keys of a [[run]] besides its offload table: key -> (choices or type, default, meaning)
RUN_KEYS = {
    "name": (str, None, "the run's name in the table and the plots (required)"),
    "checkpoint": (CHECKPOINTS, "none", "activation checkpointing of the blocks: \"full\" "
                                        "recomputes every op, \"selective\" keeps the "
                                        "linear layers' outputs and recomputes the rest"),
    "segments": (int, None, "checkpointed segments of consecutive blocks (default: about "
                            "sqrt(layers))"),
    "framework": (FRAMEWORKS, "distgrad", "\"torch\": the same model and checkpointing in "
                                          "PyTorch (its own checkpoint), without offloading"),
}
#: keys of [sweep]
SWEEP_KEYS = {
    "run": "the [[run]] the sweep varies (one with offloading)",
    "min_bytes": "offload size thresholds (bytes, K/M/G): one run each, as policy.min_bytes",
    "prefetch_bytes": "read-ahead windows (bytes, K/M/G): one run each",
}
#: tables only a ``distgrad launch`` config has
_LAUNCH_TABLES = ("world", "pipeline", "data", "optim", "checkpoint", "hooks")
_POSITIVE = {("experiment", "steps"), ("model", "batch"), ("model", "width"),
             ("model", "layers")}
_CHOICES = {("model", "activation"): ACTIVATIONS, ("store", "bind"): ("ipc", "tcp")}


class ExperimentConfigError(ValueError):
    """An experiment config that cannot run; the message names the file and the key."""


def describe():
    """Lines documenting every key (``distgrad offload --help-config``)."""
    lines = []
    for table, fields in SCHEMA.items():
        lines.append(f"[{table}]")
        for key, (_, default, doc) in fields.items():
            given = "required" if default is _REQUIRED else f"default {default!r}"
            lines.append(f"  {key:20s} {doc} ({given})")
    offload = describe_offload("run")
    lines.append("[[run]]  (one per setup, each in a process of its own: a name, its "
                 "checkpointing and an offload table; store = \"local\", the default of kind "
                 "\"remote\" here, is the store the experiment starts)")
    for key, (kind, default, doc) in RUN_KEYS.items():
        given = "" if key == "name" else f" (default {default!r})" if default else ""
        lines.append(f"  {key:20s} {doc}{given}")
    lines += offload[1:]
    lines.append("[sweep]  (optional: more runs, each the named run with one value changed)")
    lines += [f"  {key:20s} {doc}" for key, doc in SWEEP_KEYS.items()]
    return lines


def _type_name(kind):
    return {int: "an integer", float: "a number", str: "a string",
            "bytes": "a byte count (1048576, 512M, 4G)"}[kind]


def _value(kind, value):
    """``value`` as ``kind``, or ValueError."""
    if kind == "bytes":
        if isinstance(value, bool) or not isinstance(value, (int, str)):
            raise ValueError
        parse_bytes(value)
        return value
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if isinstance(value, bool) or not isinstance(value, kind):
        raise ValueError
    return value


def _table(path, data, name, fields):
    table = data.get(name, {})
    if not isinstance(table, dict):
        raise ExperimentConfigError(f"{path}: {name}: expected a table [{name}]")
    out = {}
    for key, value in table.items():
        if key not in fields:
            raise ExperimentConfigError(f"{path}: {name}.{key}: unknown key; [{name}] takes: "
                                        f"{', '.join(fields)}")
        kind = fields[key][0]
        try:
            out[key] = _value(kind, value)
        except ValueError:
            raise ExperimentConfigError(f"{path}: {name}.{key}: expected {_type_name(kind)}, "
                                        f"got {value!r}") from None
        if (name, key) in _POSITIVE and out[key] < 1:
            raise ExperimentConfigError(f"{path}: {name}.{key}: must be at least 1, got "
                                        f"{value}")
        choices = _CHOICES.get((name, key))
        if choices and value not in choices:
            raise ExperimentConfigError(f"{path}: {name}.{key}: must be one of "
                                        f"{', '.join(map(repr, choices))}, got {value!r}")
    for key, (_, default, doc) in fields.items():
        if key not in out:
            if default is _REQUIRED:
                raise ExperimentConfigError(f"{path}: {name}.{key}: missing; {doc}")
            out[key] = default
    return out


def _runs(path, data):
    runs = data.get("run")
    if not isinstance(runs, list) or not runs or not all(isinstance(r, dict) for r in runs):
        raise ExperimentConfigError(f"{path}: no [[run]] tables (each names one offloading "
                                    "setup)")
    names = set()
    for i, run in enumerate(runs):
        if not isinstance(run.get("name"), str):
            raise ExperimentConfigError(f"{path}: [[run]] #{i + 1}: name: missing (a string)")
        if run["name"] in names:
            raise ExperimentConfigError(f"{path}: [[run]] {run['name']!r}: name is used twice")
        names.add(run["name"])
        table = offload_table(run)
        where = f"{path}: [[run]] {run['name']!r}"
        try:
            kind, _ = check_config(table, where)
        except ValueError as e:
            raise ExperimentConfigError(str(e)) from None
        _check_method(run, kind, where)
        if kind in ("remote", "tiered") and "store" in table \
                and not isinstance(table["store"], str):
            raise ExperimentConfigError(f"{where}: key 'store' must be \"local\" or an "
                                        "endpoint")
    return runs


def offload_table(run):
    """The offload table of ``run`` (a [[run]] table): all but its other keys."""
    return {k: v for k, v in run.items() if k not in RUN_KEYS and k != "sweep"}


def _check_method(run, kind, where):
    for key in ("checkpoint", "framework"):
        choices = RUN_KEYS[key][0]
        if key in run and run[key] not in choices:
            raise ExperimentConfigError(f"{where}: key {key!r} must be one of "
                                        f"{', '.join(map(repr, choices))}, got {run[key]!r}")
    segments = run.get("segments")
    if segments is not None:
        if isinstance(segments, bool) or not isinstance(segments, int) or segments < 1:
            raise ExperimentConfigError(f"{where}: key 'segments' must be an integer >= 1, "
                                        f"got {segments!r}")
        if run.get("checkpoint", "none") == "none":
            raise ExperimentConfigError(f"{where}: key 'segments' needs checkpoint = \"full\" "
                                        "or \"selective\"")
    if run.get("framework") == "torch" and kind != "none":
        raise ExperimentConfigError(f"{where}: framework \"torch\" runs PyTorch without "
                                    f"offloading: give kind = \"none\", not {kind!r}")


def _sweep(path, data, runs):
    """The runs ``[sweep]`` adds: the named run with policy.min_bytes, or prefetch_bytes,
    set to each value given (one value changed at a time)."""
    table = data.get("sweep")
    if table is None:
        return []
    if not isinstance(table, dict):
        raise ExperimentConfigError(f"{path}: sweep: expected a table [sweep]")
    for key in table:
        if key not in SWEEP_KEYS:
            raise ExperimentConfigError(f"{path}: sweep.{key}: unknown key; [sweep] takes: "
                                        f"{', '.join(SWEEP_KEYS)}")
    base = next((r for r in runs if r["name"] == table.get("run")), None)
    if base is None or offload_table(base).get("kind", "disk") == "none":
        raise ExperimentConfigError(f"{path}: sweep.run: {table.get('run')!r} is not the name "
                                    "of a [[run]] that offloads")
    out = []
    for key in ("min_bytes", "prefetch_bytes"):
        values = table.get(key, [])
        if not isinstance(values, list):
            raise ExperimentConfigError(f"{path}: sweep.{key}: expected a list of byte counts")
        for value in values:
            try:
                n = parse_bytes(value) if not isinstance(value, bool) else None
            except ValueError:
                n = None
            if n is None:
                raise ExperimentConfigError(f"{path}: sweep.{key}: expected byte counts "
                                            f"(1048576, 512K, 4M), got {value!r}")
            run = {k: (dict(v) if isinstance(v, dict) else v) for k, v in base.items()}
            if key == "min_bytes":
                run["policy"] = dict(run.get("policy", {}), min_bytes=n)
            else:
                run["prefetch_bytes"] = n
            run["name"] = f"{base['name']} {key}={value}"
            run["sweep"] = {"run": base["name"], "key": key, "bytes": n}
            out.append(run)
    return out


def load_config(path):
    """The checked config of the experiment in TOML file ``path``, defaults filled in."""
    path = os.fspath(path)
    try:
        data = load_toml_table(path)
    except OSError as e:
        raise ExperimentConfigError(f"{path}: cannot read the config: {e.strerror}") from None
    except ValueError as e:
        raise ExperimentConfigError(str(e)) from None
    known = [*SCHEMA, "run", "sweep"]
    for key in data:
        if key in _LAUNCH_TABLES:
            raise ExperimentConfigError(f"{path}: {key}: not an offloading experiment's config: "
                                        f"run it with `distgrad launch {path}`")
        if key not in known:
            raise ExperimentConfigError(f"{path}: {key}: unknown table or key (known: "
                                        f"{', '.join(known)})")
    config = {name: _table(path, data, name, fields) for name, fields in SCHEMA.items()}
    config["run"] = _runs(path, data)
    config["run"] += _sweep(path, data, config["run"])
    names = {r["name"] for r in config["run"]}
    if len(names) < len(config["run"]):
        raise ExperimentConfigError(f"{path}: sweep: a swept run's name is used by a [[run]]")
    targets = config["experiment"]
    if not 0 < targets["target_memory"] <= 1 or targets["target_slowdown"] < 1:
        raise ExperimentConfigError(f"{path}: experiment.target_memory must be in (0, 1] and "
                                    "experiment.target_slowdown at least 1")
    baseline = config["experiment"]["baseline"]
    if baseline not in {r["name"] for r in config["run"]}:
        raise ExperimentConfigError(f"{path}: experiment.baseline: {baseline!r} is not the name "
                                    f"of a [[run]]")
    return config


def uses_local_store(run):
    """Whether ``run`` (a [[run]] table) uses the store the experiment starts."""
    run = offload_table(run)
    if run.get("kind") == "remote":
        return run.get("store", "local") == "local"
    return run.get("kind") == "tiered" and run.get("store") == "local"

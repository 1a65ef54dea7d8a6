"""Launch configs: TOML files checked against a schema before any process starts.

    cfg = load_config("configs/quickstart.toml", ["optim.lr=0.01", "world.workers=3"])
    cfg["optim"]["lr"]            # 0.01

Every key the schema does not know, every value of the wrong type or out of range
and every missing required field raises :class:`ConfigError`, whose message names
the key, the file and the line (or the command-line override it came from). The
tables ``model.kwargs``, ``data.kwargs``, ``offload`` and the extra keys of
``optim`` and of each ``[[hooks]]`` entry are open: they are passed to the code
they configure, which checks them (see :mod:`distgrad.launch.resolve`).

How the workers share the training (``[world]``): ``strategy = "pipeline"`` splits
the model's layers into ``workers / replicas`` stages, each on its own worker, and
runs ``replicas`` such pipelines side by side (default 1); ``strategy = "ddp"`` gives
every worker the whole model (``replicas = workers``). Each replica trains on its
shard of every batch (``data.batch_size / replicas`` samples, which must divide
evenly) and the replicas average their gradients before every optimizer step, so
the run trains like one process on the whole batch (see :mod:`distgrad.launch.grid`).
"""
import difflib
import os
import re
import sys

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10: the backport has the same API
    import tomli as tomllib

from .config_lines import Where as _Where
from .schedule import NAMES as SCHEDULES

__all__ = ["ConfigError", "load_config", "from_dict", "parse_override", "SCHEMA",
           "describe_schema", "heartbeat_interval"]


class ConfigError(ValueError):
    """A config that cannot run; ``key``, ``source`` (file or "command line") and ``line``."""

    def __init__(self, message, key=None, source=None, line=None):
        where = source or ""
        if source and line:
            where = f"{source}:{line}"
        parts = [p for p in (where, key) if p]
        super().__init__(": ".join(parts + [message]))
        self.key, self.source, self.line = key, source, line


class Field:
    """One key of the schema: its type, default, range and meaning (used in --help too)."""

    def __init__(self, kind, default=None, *, required=False, low=None, high=None,
                 choices=None, doc=""):
        self.kind, self.default, self.required = kind, default, required
        self.low, self.high, self.choices, self.doc = low, high, choices, doc

    def check(self, value):
        """The value, converted (an int where a float is expected); ValueError says why not."""
        kind = self.kind
        if kind is float and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        if kind == "int_or_auto":
            if value != "auto" and not _is(value, int):
                raise ValueError(f"expected an integer or \"auto\", got {_show(value)}")
        elif kind == "int_list":
            if not isinstance(value, list) or not all(_is(v, int) for v in value):
                raise ValueError(f"expected a list of integers, got {_show(value)}")
            if self.low is not None and any(v < self.low for v in value):
                raise ValueError(f"every entry must be at least {self.low}, got {value}")
            return value
        elif kind is dict:
            if not isinstance(value, dict):
                raise ValueError(f"expected a table, got {_show(value)}")
            return value
        elif not _is(value, kind):
            raise ValueError(f"expected {_KIND_NAMES[kind]}, got {_show(value)}")
        if self.choices is not None and value not in self.choices:
            raise ValueError(f"must be one of {', '.join(map(repr, self.choices))}, "
                             f"got {value!r}")
        if isinstance(value, (int, float)) and value != "auto":
            if self.low is not None and value < self.low:
                raise ValueError(f"must be at least {self.low}, got {value}")
            if self.high is not None and value > self.high:
                raise ValueError(f"must be at most {self.high}, got {value}")
        return value


_KIND_NAMES = {int: "an integer", float: "a number", str: "a string", bool: "true or false"}


def _is(value, kind):
    if kind is int:
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, kind)


def _show(value):
    kinds = {bool: "a boolean", int: "an integer", float: "a number", str: "a string",
             list: "an array", dict: "a table"}
    return f"{kinds.get(type(value), type(value).__name__)} ({value!r})"


#: ``[[hooks]] kind`` values; all but "step" run in the coordinator (strategy "autograd")
HOOK_KINDS = ("step", "forward", "full_backward", "tensor_grad")

#: table -> key -> Field. Tables marked OPEN also take keys the schema does not list.
SCHEMA = {
    "run": {
        "name": Field(str, doc="run directories are named <name>-<time>; default: the "
                                "config file's name"),
        "dir": Field(str, "runs", doc="where run directories go, relative to the working "
                                      "directory"),
        "steps": Field(int, low=1, doc="optimizer steps (or give epochs)"),
        "epochs": Field(int, low=1, doc="passes over the training data (instead of steps)"),
        "seed": Field(int, 0, low=0, doc="seeds the parameters and the batch order"),
        "log_every": Field(int, 10, low=1, doc="steps between console metrics lines"),
        "eval_every": Field(int, 0, low=0, doc="steps between evaluations on held-out data "
                                               "(0: at the end only)"),
        "grace_period": Field(float, 10.0, low=0.1, doc="seconds a graceful stop may take "
                                                       "before SIGKILL"),
        "max_restarts": Field(int, 0, low=0, doc="restarts of the whole world from the last "
                                                 "checkpoint after a failure"),
        "resume": Field(bool, False, doc="continue the latest run of this name from its last "
                                         "complete checkpoint"),
        "in_flight": Field(int, 2, low=1, high=8, doc="commands the coordinator sends ahead "
                                                      "(hides its own message latency; a "
                                                      "command carries a run of steps "
                                                      "worth about 20 ms)"),
    },
    "world": {
        "strategy": Field(str, "pipeline", choices=("pipeline", "autograd", "ddp"),
                          doc="how the model is spread: \"pipeline\" (layers split into "
                              "stages that hand each other activations and gradients), "
                              "\"autograd\" (the same stages as remote modules, trained by "
                              "the coordinator through distributed autograd: RPC futures, "
                              "dist_autograd.backward, DistributedOptimizer) or \"ddp\" "
                              "(every worker trains the whole model on its shard of each "
                              "batch, gradients averaged)"),
        "workers": Field(int, 2, low=1, high=256, doc="worker processes: stages x replicas "
                                                      "(the coordinator is one more)"),
        "replicas": Field(int, low=1, high=256, doc="data-parallel copies of the pipeline, "
                                                    "each on its shard of every batch; "
                                                    "\"pipeline\": world.workers / replicas "
                                                    "stages (default 1), \"ddp\": every "
                                                    "worker is one (default world.workers)"),
        "transport": Field(str, "ipc", choices=("ipc", "tcp"), doc="endpoints: unix sockets or TCP"),
        "bind_addr": Field(str, "auto", doc="address TCP endpoints bind to; auto: this "
                                            "host's address toward the rendezvous host "
                                            "(127.0.0.1 for a launch on one machine), unless "
                                            "DISTGRAD_BIND_ADDR or DISTGRAD_SOCKET_IFNAME "
                                            "say otherwise; 0.0.0.0: every interface"),
        "blas_threads": Field("int_or_auto", "auto", low=1, doc="BLAS threads per process; "
                                                               "auto: cores / workers"),
        "flush_denormal": Field(bool, False, doc="every process treats subnormal floats as "
                                                 "zero (torch.set_flush_denormal): gradients "
                                                 "that shrink toward zero stop slowing the "
                                                 "backward down, and the arithmetic differs "
                                                 "from a run without it"),
        "pin_workers": Field(bool, True, doc="pin each worker process started here to "
                                             "cores of its own (blas_threads of them, in "
                                             "turn over the cores the launcher may use); "
                                             "the coordinator is not pinned"),
        "rpc_timeout": Field(float, 120.0, low=0.0, doc="seconds one step may take before "
                                                        "the run fails (0: no limit)"),
        "heartbeat_timeout": Field(float, 3.0, low=0.2, doc="seconds of silence after which "
                                                            "a process is declared dead "
                                                            "(and how soon a hang is found)"),
        "rendezvous_timeout": Field(float, 60.0, low=0.1, doc="seconds for all to join"),
        "rendezvous_port": Field(int, 0, low=0, high=65535, doc="where rank 0 serves the "
                                 "rendezvous unless MASTER_PORT says (Slurm, mpirun, torchrun's "
                                 "agent store); 0: from the job id, or a free port"),
        "simulated_link": Field(str, doc="a network between hosts, simulated on this machine: "
                                         "every message between processes is held as if it "
                                         "crossed a link of '<latency> <bandwidth>', e.g. "
                                         "'200us 10Gbit/s' or '2ms 1Gbit/s'"),
    },
    "model": {
        "factory": Field(str, required=True, doc="\"mlp\" or \"module:qualname\" of a "
                                                 "function returning an nn.Sequential"),
        "kwargs": Field(dict, {}, doc="keyword arguments of the factory"),
        "loss": Field(str, "cross_entropy", choices=("cross_entropy", "mse"),
                      doc="loss on the last stage's output"),
        "checkpoint_activations": Field(str, "none", choices=("none", "stage", "layer"),
                                        doc="activation checkpointing: each stage keeps "
                                            "its input (\"stage\") or each layer's "
                                            "(\"layer\") and reruns its layers in backward"),
        "aux_weight": Field(float, 0.0, low=0.0, doc="weight of an auxiliary loss, the mean "
                                                    "square of the last stage's output, "
                                                    "backpropagated by a second backward over "
                                                    "the same forward (retain_graph); needs "
                                                    "world.strategy \"autograd\" (0: none)"),
    },
    "pipeline": {
        "balance": Field("int_list", low=1, doc="layers per stage (default: parameters "
                                                "spread evenly)"),
        "micro_batches": Field(int, 1, low=1, high=1024, doc="micro-batches per step (of each "
                               "replica's shard; with one stage: gradient accumulation)"),
        "schedule": Field(str, "gpipe", choices=SCHEDULES, doc="order of forward and backward "
                          "passes: torch.distributed.pipelining's schedules in lower case (the "
                          "zero-bubble ones split backward into the inputs' and weights' parts)"),
        "virtual_stages": Field(int, low=1, high=64, doc="stages per worker (interleaved and V "
                                "schedules; default 1): the model is cut into workers x these"),
        "defer_weight_grads": Field(bool, True, doc="a micro-batch's backward computes "
                                    "the gradients the stage before waits for; linear "
                                    "weights' gradients follow in one product per weight "
                                    "before the optimizer step (same results; keeps the "
                                    "stage's inputs until then). Not with model.aux_weight, "
                                    "world.replicas > 1, [offload] or zero-bubble schedules "
                                    "(their W passes split the backward per micro-batch)"),
    },
    "data": {
        "source": Field(str, required=True, doc="\"spirals\", \"gaussians\" or "
                                                "\"module:qualname\" returning (x, y)"),
        "kwargs": Field(dict, {}, doc="keyword arguments of the source"),
        "batch_size": Field(int, required=True, low=1, doc="samples per step, over all "
                                                            "replicas"),
        "eval_fraction": Field(float, 0.2, low=0.0, high=0.9, doc="share of the samples "
                                                                  "held out for evaluation"),
    },
    "optim": {
        "name": Field(str, "Adam", doc="a distgrad.optim class or \"module:qualname\"; the "
                                       "other keys are its arguments"),
    },
    "checkpoint": {
        "every": Field(int, 0, low=0, doc="steps between checkpoints (0: only on a graceful "
                                          "stop and at the end)"),
        "keep": Field(int, 2, low=1, doc="complete checkpoints kept"),
    },
    "hooks": {  # an array of tables; each entry's other keys are the hook's arguments
        "ref": Field(str, required=True, doc="\"module:qualname\" of the hook function; what "
                                             "it returns (a dict of numbers) is logged as "
                                             "<key>.stage<N>"),
        "kind": Field(str, "step", choices=HOOK_KINDS,
                      doc="\"step\": hook(module) on every stage before its optimizer step "
                          "(pipeline, ddp); with world.strategy \"autograd\", hooks on the "
                          "stages' modules that run in the coordinator: \"forward\" "
                          "hook(module_name, inputs, output), \"full_backward\" "
                          "hook(module_name, grad_input, grad_output), \"tensor_grad\" "
                          "hook(grad) of the parameter named by 'parameter' (values averaged "
                          "over a step's calls)"),
        "stages": Field("int_list", low=0, doc="the stages whose modules get a forward or "
                                               "full_backward hook; without it: all"),
        "parameter": Field(str, doc="kind \"tensor_grad\": the parameter, named as in the "
                                    "whole model's named_parameters() (e.g. '0.weight')"),
    },
    "offload": {},  # per-worker offload policy, passed through to each stage
}

#: tables of other commands' configs: given one, a launch names the command to run
OTHER_COMMANDS = {"experiment": "distgrad offload"}
OPEN = {"optim", "hooks", "offload"}
ARRAY_OF_TABLES = {"hooks"}
OPEN_FIELDS = {("model", "kwargs"), ("data", "kwargs")}


def heartbeat_interval(timeout):
    """How often processes ping each other, given ``world.heartbeat_timeout``."""
    return min(0.5, timeout / 4)


def describe_schema():
    """Lines documenting every key (for ``distgrad launch --help-config``)."""
    from distgrad.offload.config import describe
    lines = []
    for table, fields in SCHEMA.items():
        if table == "offload":  # checked by the offload package, which documents it
            offload = describe(table)
            lines.append(offload[0] + "  (each stage's activation offloading; without it: "
                                       "none)")
            lines += offload[1:]
            continue
        header = f"[[{table}]]" if table in ARRAY_OF_TABLES else f"[{table}]"
        lines.append(header + ("  (other keys: passed through)" if table in OPEN else ""))
        for key, f in fields.items():
            default = "required" if f.required else \
                "optional" if f.default is None else f"default {f.default!r}"
            lines.append(f"  {key:20s} {f.doc} ({default})")
    return lines


def _error(where, key, message):
    source, line = where(key)
    return ConfigError(message, key=key, source=source, line=line)


# -- overrides ----------------------------------------------------------------------

def parse_override(text):
    """``"optim.lr=0.01"`` -> (["optim", "lr"], 0.01). The value is read as TOML, and
    taken as a plain string when it is not TOML (``data.source=spirals``)."""
    key, sep, raw = text.partition("=")
    key = key.strip()
    if not sep or not key or not all(p.strip() for p in key.split(".")):
        raise ConfigError(f"an override is key=value with a dotted key, got {text!r}",
                          source="command line")
    try:
        value = tomllib.loads(f"v = {raw.strip()}")["v"]
    except tomllib.TOMLDecodeError:
        value = raw.strip()
    return [p.strip() for p in key.split(".")], value


def _apply_override(data, parts, value, text, where):
    table = data
    for i, p in enumerate(parts[:-1]):
        nxt = table.get(p)
        if isinstance(nxt, list) and p in ARRAY_OF_TABLES:
            raise ConfigError(f"entries of [[{p}]] cannot be overridden from the command line; "
                              "edit the file", key=".".join(parts), source="command line")
        if nxt is None:
            nxt = table[p] = {}
        if not isinstance(nxt, dict):
            raise ConfigError(f"{'.'.join(parts[:i + 1])} is not a table",
                              key=".".join(parts), source="command line")
        table = nxt
    table[parts[-1]] = value
    where.overrides[".".join(parts)] = text


# -- loading and checking -----------------------------------------------------------

def load_config(path, overrides=()):
    """Read ``path``, apply ``key=value`` overrides, check and fill in defaults.

    Returns a plain dict with every table of :data:`SCHEMA` present. Raises
    :class:`ConfigError` for anything that would fail later.
    """
    path = os.fspath(path)
    try:
        with open(path, "rb") as fh:
            raw = fh.read()
    except OSError as e:
        raise ConfigError(f"cannot read the config: {e.strerror}", source=path) from None
    text = raw.decode("utf-8", errors="replace")
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"not valid TOML: {e}", source=path) from None
    where = _Where(path, text)
    for item in overrides:
        parts, value = parse_override(item)
        _apply_override(data, parts, value, item, where)
    config = check(data, where)
    config["run"].setdefault("name", None)
    if config["run"]["name"] is None:
        config["run"]["name"] = os.path.splitext(os.path.basename(path))[0]
    return config


def from_dict(data, source="<dict>"):
    """Check a config given as a dict (parsed TOML) and fill in its defaults."""
    return check(data, _Where(source, None))


def check(data, where):
    """Validate ``data`` (the parsed TOML) and return it with defaults filled in."""
    out = {}
    for table in data:
        if table in OTHER_COMMANDS:
            raise _error(where, table, f"not a launch config: run it with "
                                       f"`{OTHER_COMMANDS[table]} {where.path}`")
        if table not in SCHEMA:
            raise _error(where, table, f"unknown table or key{_did_you_mean(table, SCHEMA)}; "
                                       f"known: {', '.join(SCHEMA)}")
    for table, fields in SCHEMA.items():
        value = data.get(table, [] if table in ARRAY_OF_TABLES else {})
        if table in ARRAY_OF_TABLES:
            if not isinstance(value, list) or not all(isinstance(v, dict) for v in value):
                raise _error(where, table, f"expected an array of tables ([[{table}]]), got "
                                           f"{_show(value)}")
            out[table] = [_check_table(f"{table}.{i}", entry, fields, table in OPEN, where)
                          for i, entry in enumerate(value)]
        else:
            if not isinstance(value, dict):
                raise _error(where, table, f"expected a table, got {_show(value)}")
            out[table] = _check_table(table, value, fields, table in OPEN, where)
    _check_together(out, where)
    return out


def _did_you_mean(name, known):
    """`` (did you mean 'optim'?)`` for a near miss of one of ``known``, else ``""``."""
    close = difflib.get_close_matches(name, list(known), n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _check_table(name, value, fields, open_table, where):
    out = {}
    for key, v in value.items():
        field = fields.get(key)
        dotted = f"{name}.{key}"
        if field is None:
            if not open_table:
                known = ", ".join(fields) or "none"
                raise _error(where, dotted, f"unknown key{_did_you_mean(key, fields)}; "
                                            f"{name} takes: {known}")
            out[key] = v
            continue
        try:
            out[key] = field.check(v)
        except ValueError as e:
            raise _error(where, dotted, str(e)) from None
    for key, field in fields.items():
        if key in out:
            continue
        if field.required:
            raise _error(where, f"{name}.{key}", f"missing; {field.doc}")
        if field.default is not None:
            out[key] = dict(field.default) if isinstance(field.default, dict) else field.default
    return out


def _check_together(c, where):
    run = c["run"]
    if "steps" in run and "epochs" in run:
        raise _error(where, "run.epochs", "give run.steps or run.epochs, not both")
    if "steps" not in run and "epochs" not in run:
        raise _error(where, "run.steps", "missing; give run.steps or run.epochs")
    stages, replicas = _check_grid(c["world"], where)
    balance = c["pipeline"].get("balance")
    if balance is not None and len(balance) != (cut := stages * c["pipeline"].get(
            "virtual_stages", 1)):
        raise _error(where, "pipeline.balance", f"gives {len(balance)} stages but the world has "
                     f"{cut} (world.workers {c['world']['workers']} / world.replicas {replicas}"
                     + (" x pipeline.virtual_stages)" if cut != stages else ")"))
    mb, batch = c["pipeline"]["micro_batches"], c["data"]["batch_size"]
    if batch % replicas:
        raise _error(where, "data.batch_size",
                     f"{batch} samples cannot be split into {replicas} equal shards "
                     f"(world.replicas {replicas}): make it a multiple of {replicas}")
    if mb > batch // replicas:
        shard = "" if replicas == 1 else f"'s shard of {batch // replicas} samples per replica"
        raise _error(where, "pipeline.micro_batches",
                     f"{mb} micro-batches cannot split data.batch_size {batch}{shard}")
    for ref_key in ("model.factory", "data.source", "optim.name"):
        table, key = ref_key.split(".")
        _check_reference_syntax(c[table][key], ref_key, where)
    for i, hook in enumerate(c["hooks"]):
        _check_reference_syntax(hook["ref"], f"hooks.{i}.ref", where, builtin_names=False)
    _check_strategy(c, stages, where)
    if c["offload"]:
        from distgrad.offload.config import check_config
        try:
            check_config(c["offload"], "offload")
        except ValueError as e:  # names the key; the file and line come from here
            key = str(e).split("'")[1] if "'" in str(e) else ""
            raise _error(where, f"offload.{key}" if key else "offload", str(e)) from None


def _check_strategy(c, stages, where):
    """What only the autograd strategy offers, and what it does not (yet) offer."""
    world = c["world"]
    autograd = world["strategy"] == "autograd"
    if c["model"]["aux_weight"] and not autograd:
        raise _error(where, "model.aux_weight", "an auxiliary loss needs world.strategy "
                                                f"\"autograd\", not {world['strategy']!r}")
    for i, hook in enumerate(c["hooks"]):
        kind = hook["kind"]
        if kind != "step" and not autograd:
            raise _error(where, f"hooks.{i}.kind", f"{kind!r} hooks run in the coordinator "
                                                   f"and need world.strategy \"autograd\"; "
                                                   f"with {world['strategy']!r} use \"step\"")
        if kind == "step" and autograd:
            raise _error(where, f"hooks.{i}.kind", "\"step\" hooks (run on each stage before "
                                                   "its optimizer step) are not available "
                                                   "with world.strategy \"autograd\": use "
                                                   "\"forward\", \"full_backward\" or "
                                                   "\"tensor_grad\"")
        if kind == "tensor_grad" and "parameter" not in hook:
            raise _error(where, f"hooks.{i}.parameter", "missing; a \"tensor_grad\" hook "
                                                        "names the parameter it watches")
        if kind != "tensor_grad" and "parameter" in hook:
            raise _error(where, f"hooks.{i}.parameter", f"only \"tensor_grad\" hooks watch "
                                                        f"a parameter, not {kind!r} ones")
        if "stages" in hook:
            if kind not in ("forward", "full_backward"):
                raise _error(where, f"hooks.{i}.stages", f"only \"forward\" and "
                                                         f"\"full_backward\" hooks take "
                                                         f"stages, not {kind!r} ones")
            bad = [k for k in hook["stages"] if k >= stages]
            if bad:
                raise _error(where, f"hooks.{i}.stages", f"stage {bad[0]} does not exist: "
                                                         f"the pipeline has {stages} stages "
                                                         f"(0 to {stages - 1})")
    if autograd and world["replicas"] > 1:
        raise _error(where, "world.replicas", "world.strategy \"autograd\" trains one "
                                              "pipeline; data-parallel replicas need "
                                              "\"pipeline\" or \"ddp\"")
    if autograd and c["offload"]:
        raise _error(where, "offload", "activation offloading is not available with "
                                       "world.strategy \"autograd\" yet: use \"pipeline\"")
    if "simulated_link" in world:
        from distgrad.rpc.link import parse_link
        try:
            parse_link(world["simulated_link"])
        except ValueError as e:
            raise _error(where, "world.simulated_link", str(e)) from None


def _check_grid(world, where):
    """(stages, replicas) of ``world``, whose ``replicas`` gets its default here."""
    workers, replicas = world["workers"], world.get("replicas")
    if world["strategy"] == "ddp":
        if replicas is not None and replicas != workers:
            raise _error(where, "world.replicas",
                         f"with world.strategy \"ddp\" every worker is a replica: "
                         f"give {workers} (world.workers) or leave it out, not {replicas}")
        world["replicas"] = workers
        return 1, workers
    replicas = world["replicas"] = replicas or 1
    if workers % replicas:
        raise _error(where, "world.replicas",
                     f"{replicas} replicas cannot share world.workers {workers} equally "
                     f"(each replica is world.workers / world.replicas stages)")
    return workers // replicas, replicas


_REFERENCE = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_][\w.]*$")


def _check_reference_syntax(value, key, where, builtin_names=True):
    if builtin_names and ":" not in value:
        if not value.isidentifier():
            raise _error(where, key, f"{value!r} is neither a built-in name nor "
                                     "'module:qualname'")
        return
    if not _REFERENCE.match(value):
        raise _error(where, key, f"{value!r} is not a reference of the form 'module:qualname'")


def error_for(config_path, key, message, overrides=()):
    """A :class:`ConfigError` for ``key`` found wrong after loading (bad reference...)."""
    text = None
    try:
        with open(config_path, encoding="utf-8", errors="replace") as fh:
            text = fh.read()
    except OSError:
        pass
    where = _Where(config_path, text)
    for item in overrides:
        try:
            parts, _ = parse_override(item)
        except ConfigError:
            continue
        where.overrides[".".join(parts)] = item
    return _error(where, key, message)

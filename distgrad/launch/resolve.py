"""From a checked config to the things it names: functions, classes, the stage split.

:func:`plan` imports what the config references (``module:qualname`` or a
built-in name), checks the keyword arguments against their signatures, builds the
model once to split its layers into stages, and lists the modules the workers must
allow. The launcher calls it before starting any process, so every mistake is a
:class:`~distgrad.launch.config.ConfigError` naming its key; the coordinator calls
it again to build the stages.
"""
import difflib
import importlib
import inspect

import distgrad
from distgrad.autograd import defer_weight_grads
import distgrad.optim

from . import data as _data
from . import models as _models
from . import schedule as schedules
from .config import ConfigError
from .grid import Grid

__all__ = ["Plan", "CoordinatorHook", "plan", "reference", "even_balance", "WORKER_MODULES",
           "deferred_weights"]

#: modules every stage worker allows: the commands, built-in models and hooks
WORKER_MODULES = ("distgrad.launch.stage", "distgrad.launch.remote_stage", "distgrad.launch.models",
                  "distgrad.launch.hooks")


def reference(text, builtins=None):
    """The object named by a built-in name or ``"module:qualname"``; LookupError says why."""
    if ":" not in text:
        if builtins is None or text not in builtins:
            known = ", ".join(sorted(builtins or ()))
            raise LookupError(f"{text!r} is not a built-in name (known: {known}) nor "
                              "'module:qualname'")
        return builtins[text]
    module_name, _, qualname = text.partition(":")
    try:
        obj = importlib.import_module(module_name)
    except ImportError as e:
        raise LookupError(f"cannot import {module_name!r}: {e}") from None
    for part in qualname.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise LookupError(f"{module_name!r} has no {qualname!r}") from None
    if not callable(obj):
        raise LookupError(f"{text!r} is not callable")
    return obj


#: keys of a ``[[hooks]]`` entry that are not the hook's arguments
_HOOK_KEYS = ("ref", "kind", "stages", "parameter")
#: positional arguments a hook of each kind gets before its keyword arguments
_HOOK_ARGUMENTS = {"step": 1, "forward": 3, "full_backward": 3, "tensor_grad": 1}


class CoordinatorHook:
    """A ``[[hooks]]`` entry that runs in the coordinator (``world.strategy = "autograd"``):
    entry ``index`` of the config, its ``kind``, the function and its keyword arguments,
    the ``stages`` it is registered on and (kind "tensor_grad") the ``parameter``."""

    def __init__(self, index, kind, fn, kwargs, stages, parameter):
        self.index, self.kind, self.fn, self.kwargs = index, kind, fn, kwargs
        self.stages, self.parameter = stages, parameter


class Plan:
    """What a config resolves to; ``error(key, message)`` makes a ConfigError for it."""

    def __init__(self, config, error):
        self.config, self.error = config, error
        model, data, optim = config["model"], config["data"], config["optim"]
        self.factory = self._ref("model.factory", model["factory"], _models.BUILTIN)
        self._bind("model.kwargs", self.factory, model["kwargs"])
        self.source = self._ref("data.source", data["source"], _data.BUILTIN)
        self._bind("data.kwargs", self.source, data["kwargs"])
        optimizers = {n: c for n, c in vars(distgrad.optim).items()
                      if isinstance(c, type) and issubclass(c, distgrad.optim.Optimizer)}
        self.optimizer = self._ref("optim.name", optim["name"], optimizers)
        self.optimizer_kwargs = {k: v for k, v in optim.items() if k != "name"}
        self.hooks = []              # kind "step": (fn, kwargs), run on the stages
        self.coordinator_hooks = []  # the other kinds: CoordinatorHook, run in the coordinator
        for i, hook in enumerate(config["hooks"]):
            fn = self._ref(f"hooks.{i}.ref", hook["ref"])
            kwargs = {k: v for k, v in hook.items() if k not in _HOOK_KEYS}
            kind = hook.get("kind", "step")
            self._bind(f"hooks.{i}", fn, kwargs, leading=_HOOK_ARGUMENTS[kind])
            if kind == "step":
                self.hooks.append((fn, kwargs))
            else:
                self.coordinator_hooks.append(CoordinatorHook(i, kind, fn, kwargs,
                                                              hook.get("stages"),
                                                              hook.get("parameter")))
        self.layers = self._split()
        for hook in self.coordinator_hooks:
            self._place(hook)
        self.deferred_weight_names = self._deferred_weight_names()
        self._check_optimizer()

    def _deferred_weight_names(self):
        """The parameters whose gradients wait for the end of a step
        (``pipeline.defer_weight_grads``), by name (a stage's slice keeps the model's
        names); none where deferring would change a result: one micro-batch (nothing to
        gain), a zero-bubble schedule (its W passes defer them per micro-batch), a second
        backward over the graph (model.aux_weight), gradients averaged
        during backward (replicas) or inputs offloaded (they would be kept). A weight with
        a gradient hook gets its gradient per micro-batch, as the hook sees it, in the
        stages and in the one-process run alike (the same sums, bit for bit)."""
        config, world = self.config, self.config["world"]
        pipeline = config["pipeline"]
        if not pipeline["defer_weight_grads"] or pipeline["micro_batches"] < 2 \
                or schedules.split_backward(pipeline["schedule"]) \
                or config["model"]["aux_weight"] or config["offload"] \
                or world["strategy"] == "ddp" or (world.get("replicas") or 1) > 1:
            return []
        hooked = {h.parameter for h in self.coordinator_hooks if h.parameter}
        return [n for n in self.parameter_names if n not in hooked]

    def _place(self, hook):
        """The stages a coordinator hook is registered on (a parameter: its stage's)."""
        stages = len(self.layers)
        if hook.parameter is None:
            hook.stages = list(range(stages)) if hook.stages is None else hook.stages
            return
        layer = hook.parameter.partition(".")[0]
        names = self.parameter_names
        if hook.parameter not in names:
            close = difflib.get_close_matches(hook.parameter, names, n=1)
            raise self.error(f"hooks.{hook.index}.parameter",
                             f"the model has no parameter {hook.parameter!r}"
                             + (f" (did you mean {close[0]!r}?)" if close else "")
                             + f"; its parameters: {', '.join(names[:6])}"
                             + (", ..." if len(names) > 6 else ""))
        hook.stages = [next(k for k, (a, b) in enumerate(self.layers) if a <= int(layer) < b)]

    def _ref(self, key, text, builtins=None):
        try:
            return reference(text, builtins)
        except LookupError as e:
            raise self.error(key, str(e)) from None

    def _bind(self, key, fn, kwargs, leading=0):
        """Check ``fn(*leading, **kwargs)`` would bind: an unknown argument names its key."""
        try:
            sig = inspect.signature(fn)
        except (TypeError, ValueError):
            return
        where = f"(calling {fn.__module__}:{fn.__qualname__})"
        params = sig.parameters.values()
        if not any(p.kind is p.VAR_KEYWORD for p in params):
            names = {p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
            for k in kwargs:
                if k not in names:
                    raise self.error(f"{key}.{k}", f"got an unexpected keyword argument "
                                                   f"{k!r} {where}")
        try:
            sig.bind(*([None] * leading), **kwargs)
        except TypeError as e:
            raise self.error(key, f"{e} {where}") from None

    def _pipeline_stages(self):
        """How many stages the model is cut into: workers per replica x virtual stages
        (checked against the schedule; its constraints name their key)."""
        pipe, world = self.config["pipeline"], self.config["world"]
        stages, virtual = Grid.of(self.config).stages, pipe.get("virtual_stages", 1)
        if world["strategy"] != "pipeline" and (virtual > 1 or
                                                pipe["schedule"] not in ("gpipe", "1f1b")):
            raise self.error("pipeline.schedule", "schedules other than gpipe and 1f1b, and "
                             f"virtual stages, need world.strategy \"pipeline\", not "
                             f"{world['strategy']!r}")
        if virtual > 1 and stages == 1 and (world.get("replicas") or 1) > 1:
            raise self.error("pipeline.virtual_stages", "replicas of a one-worker pipeline "
                             "average through DDP, which wraps one stage: give each pipeline "
                             "2 or more workers, or virtual_stages 1")
        why = schedules.check(pipe["schedule"], stages, virtual, pipe["micro_batches"])
        if why is not None:
            raise self.error("pipeline.schedule", why)
        return stages * virtual

    def _split(self):
        model_cfg, stages = self.config["model"], self._pipeline_stages()
        try:
            distgrad.manual_seed(self.config["run"]["seed"])
            model = self.factory(**model_cfg["kwargs"])
        except Exception as e:  # noqa: BLE001 - any failure of user code names the key
            raise self.error("model.factory", f"building the model failed: "
                                              f"{type(e).__name__}: {e}") from None
        if not isinstance(model, distgrad.nn.Sequential):
            raise self.error("model.factory", f"must return an nn.Sequential (its layers "
                                              f"become stages), got {type(model).__name__}")
        self.parameters = sum(p.numel() for p in model.parameters())
        self.parameter_names = [name for name, _ in model.named_parameters()]
        sizes = [sum(p.numel() for p in layer.parameters()) for layer in model]
        balance = self.config["pipeline"].get("balance")
        if balance is None:
            if len(sizes) < stages:
                raise self.error("world.workers", f"{stages} stages need at least {stages} "
                                                  f"layers; the model has {len(sizes)}")
            balance = even_balance(sizes, stages)
        elif sum(balance) != len(sizes):
            raise self.error("pipeline.balance", f"covers {sum(balance)} layers but the model "
                                                 f"has {len(sizes)}")
        bounds, start = [], 0
        for n in balance:
            bounds.append((start, start + n))
            start += n
        self.balance = list(balance)
        self.stage_parameters = [sum(sizes[a:b]) for a, b in bounds]
        return bounds

    def _check_optimizer(self):
        """Build the optimizer on a probe parameter; a failure names the argument that
        causes it (the one whose removal makes it succeed)."""
        def build(kwargs):
            self.optimizer([distgrad.nn.Parameter(distgrad.zeros(1))], **kwargs)
        kwargs = self.optimizer_kwargs
        try:
            build(kwargs)
        except (TypeError, ValueError) as e:
            bad = None
            for k in kwargs:
                try:
                    build({n: v for n, v in kwargs.items() if n != k})
                except (TypeError, ValueError):
                    continue
                bad = k
                break
            what = f" ({bad} = {kwargs[bad]!r})" if bad else ""
            raise self.error(f"optim.{bad}" if bad else "optim",
                             f"{self.optimizer.__name__}{what}: {e}") from None

    def worker_modules(self):
        """Modules the stage workers must allow: ours plus those the config references."""
        refs = [self.config["model"]["factory"], self.config["optim"]["name"]]
        refs += [h["ref"] for h in self.config["hooks"]]
        extra = [r.partition(":")[0] for r in refs if ":" in r]
        return list(dict.fromkeys(list(WORKER_MODULES) + ["distgrad.optim"] + extra))


def plan(config, error=None):
    """Resolve ``config``; ``error(key, message)`` makes the exception (a ConfigError)."""
    return Plan(config, error or (lambda key, message: ConfigError(message, key=key)))


def even_balance(sizes, stages):
    """Layers per stage so the largest stage's parameter count is smallest.

    Parameterless layers (activations) stay with the layer before them.

    >>> even_balance([10, 0, 10, 0, 10, 0, 2], 2)
    [4, 3]
    """
    blocks = []  # [size, layer count]: a layer with parameters and what follows it
    for s in sizes:
        if s == 0 and blocks:
            blocks[-1][1] += 1
        else:
            blocks.append([s, 1])
    if len(blocks) < stages:  # too few parameterised layers: split by layer count
        base, extra = divmod(len(sizes), stages)
        return [base + (i < extra) for i in range(stages)]
    # the smallest possible maximum, by bisection on it; then cut greedily under it
    low, high = max(b[0] for b in blocks), sum(b[0] for b in blocks)
    while low < high:
        mid = (low + high) // 2
        if _cuts(blocks, mid, stages) is not None:
            high = mid
        else:
            low = mid + 1
    return _cuts(blocks, low, stages)


def _cuts(blocks, limit, stages):
    """Layer counts of exactly ``stages`` contiguous groups of blocks, each group's
    size at most ``limit``, or None. Greedy: close a group when the next block would
    overflow it, or when every block left must open a group of its own."""
    groups, size, layers = [], 0, 0
    for i, (s, n) in enumerate(blocks):
        if layers and (size + s > limit or len(blocks) - i == stages - len(groups) - 1):
            groups.append(layers)
            size, layers = 0, 0
        size += s
        layers += n
    groups.append(layers)
    return groups if len(groups) == stages else None


def deferred_weights(module, names):
    """A ``defer_weight_grads`` of ``module``'s parameters called ``names``, or None."""
    names = set(names)
    weights = [w for n, w in module.named_parameters() if n in names]
    return defer_weight_grads(weights) if weights else None

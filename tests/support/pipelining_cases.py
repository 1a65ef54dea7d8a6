"""What the ranks of the pipelining tests' world run (``pg_world.World``), and the models and
references the tests compare them with.

Every case makes a fresh process group of the ranks it uses (all ranks call
``new_group``, in the same order), so a case that fails on purpose, leaving failure
notices behind, cannot reach the next one. A case returns plain data: each rank's
parameter gradients by their name in the whole model, the last stage's output and
losses, or the error it raised.
"""
from collections import OrderedDict

import numpy as np

import distgrad
import distgrad.distributed as dist
from distgrad import nn
from distgrad.distributed.pipelining import PipelineStage
from distgrad.distributed.pipelining._utils import generate_rank_to_stage_mapping
from distgrad.distributed.pipelining.schedules import _PipelineScheduleRuntime, get_schedule_class
from distgrad.nn.parallel import DistributedDataParallel
from support import pg_world

CASES, case = pg_world.registry()

SINGLE = ("GPipe", "1F1B")
V_STYLE = ("ZBVZeroBubble", "DualPipeV")


def model(n_stages, d=8, seed=0, tie=False):
    """The whole model: stage k is ``Sequential(Linear, ReLU, Linear)`` named ``"k"``;
    ``tie``: the last stage's first weight is the first stage's (one Parameter)."""
    distgrad.manual_seed(seed)
    full = nn.Sequential(OrderedDict(
        (str(k), nn.Sequential(nn.Linear(d, d), nn.ReLU(), nn.Linear(d, d)))
        for k in range(n_stages)))
    if tie:
        full[n_stages - 1][0].weight = full[0][0].weight
    return full


def batch(rows, d=8, seed=1):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((rows, d)).astype(np.float32)
    y = rng.standard_normal((rows, d)).astype(np.float32)
    return distgrad.from_numpy(x), distgrad.from_numpy(y)


def grads_of(modules):
    return {f"{k}.{n}": p.grad.numpy().copy() for k, m in modules.items()
            for n, p in m.named_parameters(remove_duplicate=False) if p.grad is not None}


def reference(n_stages, steps, batches, loss="sum", d=8, tie=False):
    """One process: ``steps`` steps, each ``model(x)`` for its (x, y) of ``batches``,
    gradients zeroed before each; returns the last step's gradients, output and loss."""
    full = model(n_stages, d, tie=tie)
    loss_fn = nn.MSELoss(reduction=loss)
    for i in range(steps):
        x, y = batches[i % len(batches)]
        full.zero_grad()
        out = full(x)
        value = loss_fn(out, y)
        value.backward()
    return {"grads": grads_of(dict(full.named_children())), "out": out.detach().numpy(),
            "loss": value.item()}


def stage_indices(name, rank, ranks, n_local):
    if name in SINGLE:
        return [rank]
    style = "v" if name in V_STYLE else "loop"
    return generate_rank_to_stage_mapping(ranks, ranks * n_local, style)[rank]


def _group(ctx, ranks):
    g = dist.new_group(ranks)  # every rank calls it: a fresh group for this case
    return g if ctx.rank in ranks else None


def _run_steps(schedule, stages, config, batches):
    """Run the steps a case asks for; the last stage's output and losses."""
    out, losses = None, []
    first = any(s.is_first for s in stages)
    last = any(s.is_last for s in stages)
    for i in range(config.get("steps", 1)):
        x, y = batches[i % len(batches)]
        for s in stages:
            s.submod.zero_grad()
        args = (x,) if first else ()
        kwargs = {"target": y, "losses": losses} if last else {}
        if config.get("eval"):
            out = schedule.eval(*args, **kwargs)
        else:
            out = schedule.step(*args, **kwargs)
    return out, losses


class Boom(nn.Module):
    """Passes its input through; raises on its ``at``-th call."""

    def __init__(self, at):
        super().__init__()
        self.at, self.calls = at, 0

    def forward(self, x):
        self.calls += 1
        if self.calls == self.at:
            raise ZeroDivisionError(f"boom at call {self.calls}")
        return x


def _stage_module(full, k, config):
    module = full[k]
    if config.get("boom", {}).get("stage") == k:
        module = nn.Sequential(OrderedDict([("0", module), ("boom", Boom(config["boom"]["at"]))]))
    hook = config.get("hook", {})
    if hook.get("stage") == k:
        change = {"flatten": lambda t: t.flatten(), "float64": lambda t: t.double()}[hook["kind"]]
        module.register_forward_hook(lambda m, i, o: change(o))
    return module


def _declared(config, k, d):
    decl = config.get("declare", {}).get(str(k), {})
    return {key: distgrad.zeros(*shape) for key, shape in decl.items()}


@case
def train(ctx, config):
    """A pipeline of ``config["ranks"]`` ranks runs ``config["schedule"]``; the config's
    other keys bend it (see the tests)."""
    ranks = config.get("ranks", [0, 1])
    group = _group(ctx, ranks)
    if group is None:
        return None
    name = config["schedule"]
    n_local = config.get("n_local", 1 if name in SINGLE else 2)
    rank = ranks.index(ctx.rank)
    n_stages = config.get("n_stages", len(ranks) * n_local)
    d = config.get("d", 8)
    full = model(n_stages, d, tie=config.get("tie", False))
    mine = config["stages"][rank] if "stages" in config else \
        stage_indices(name, rank, len(ranks), n_local)
    stages = [PipelineStage(_stage_module(full, k, config), k, n_stages, group=group,
                            **_declared(config, k, d)) for k in mine]
    loss_fn = nn.MSELoss(reduction=config.get("loss", "sum"))
    chunks = config.get("chunks_by_rank", {}).get(str(rank), config.get("chunks", 4))
    cls = get_schedule_class(name) if name != "runtime" else _PipelineScheduleRuntime
    schedule = cls(stages[0] if name in SINGLE else stages, chunks, loss_fn=loss_fn,
                   scale_grads=config.get("scale_grads", False))
    if name == "runtime":
        schedule._load_actions(config["actions"], config.get("format", "compute_only"))
    batches = [batch(r, d, seed=1 + i) for i, r in enumerate(config.get("rows", [16]))]
    out, losses = _run_steps(schedule, stages, config, batches)
    result = {"grads": grads_of({str(s.stage_index): s.submod for s in stages}),
              "out": None if out is None else out.detach().numpy(),
              "losses": [float(v.item()) for v in losses]}
    bad = config.get("then_on_rank0")
    if bad and rank == 0:  # one more step on rank 0 alone, with a bad input or output
        x = batch(16, d)[0]
        if bad in ("int", "float64"):
            x = x.to(distgrad.int32) if bad == "int" else x.double()
        else:
            _stage_module(full, 0, {"hook": {"stage": 0, "kind": bad}})
        try:
            schedule.step(x)
        except Exception as e:  # noqa: BLE001 - the test checks which and what
            result["then"] = [type(e).__name__, str(e)]
    return result


@case
def replicated(ctx, config):
    """Two replicas of a two-rank pipeline (ranks 0-1 and 2-3), each stage's module in a
    DistributedDataParallel over its replicas; each replica trains on half the batch."""
    pipes = [dist.new_group([0, 1]), dist.new_group([2, 3])]
    replicas = [dist.new_group([0, 2]), dist.new_group([1, 3])]
    replica, rank = divmod(ctx.rank, 2)
    name, n_local = config["schedule"], 1 if config["schedule"] in SINGLE else 2
    n_stages = 2 * n_local
    full = model(n_stages)
    stages = [PipelineStage(DistributedDataParallel(full[k], process_group=replicas[rank]), k,
                            n_stages, group=pipes[replica])
              for k in stage_indices(name, rank, 2, n_local)]
    schedule = get_schedule_class(name)(stages[0] if name in SINGLE else stages, 4,
                                        loss_fn=nn.MSELoss(), scale_grads=True)
    x, y = batch(16)
    half = slice(8 * replica, 8 * replica + 8)
    first, last = any(s.is_first for s in stages), any(s.is_last for s in stages)
    schedule.step(*((x[half],) if first else ()), **({"target": y[half]} if last else {}))
    return grads_of({str(s.stage_index): s.submod.module for s in stages})


@case
def errors(ctx, config):
    """Run a step expected to fail on some ranks: each rank's (error type, message)."""
    try:
        return [True, train(ctx, config)]
    except Exception as e:  # noqa: BLE001 - the test checks which and what
        return [False, type(e).__name__, str(e)]

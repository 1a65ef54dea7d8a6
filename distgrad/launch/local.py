"""The training a launch config describes, in one process: the baseline of a pipeline.

Same model (built from the same seed), same batches, same micro-batches, same
loss scaling and optimizer as the stages run, without processes or messages, so a
pipeline's losses can be checked against it and its speed compared with it
(``scripts/bench_launch.py``).

>>> from distgrad.launch.config import from_dict
>>> cfg = from_dict({"run": {"steps": 3},
...                  "model": {"factory": "mlp", "kwargs": {"sizes": [2, 4, 2]}},
...                  "data": {"source": "spirals", "kwargs": {"n": 64}, "batch_size": 8}})
>>> len(train_in_one_process(cfg))
3

With ``model.aux_weight``, the auxiliary losses' gradients are summed apart and
added to the main losses' at the end, as the autograd strategy's two distributed
backward passes sum them.

Hooks see the whole model here, each stage only its own part in a pipeline: a
clipping hook clips by the global norm here and per stage there.

Each stage adds its micro-batches' gradients up in micro-batch order, as this loop does,
in every schedule but Looped BFS, whose backward passes run in reverse (here too).
"""
from contextlib import nullcontext

import distgrad
from distgrad.flush_denormal import flushing

from .data import Batches, micro_batches, split
from .resolve import deferred_weights, plan
from .losses import LOSSES, auxiliary_loss
from .schedule import backward_reversed

__all__ = ["train_in_one_process"]


def train_in_one_process(config, steps=None, on_step=None):
    """Train as ``config`` says for ``steps`` (default: the config's) steps; the losses.

    ``on_step(step, loss)`` is called after each step (a benchmark's clock). With
    ``world.flush_denormal`` it computes as the stages do, flushing subnormals, and puts
    the calling thread's setting back at the end.
    """
    with flushing(config["world"].get("flush_denormal", False)):
        return _train(config, steps, on_step)


def _train(config, steps, on_step):
    p = plan(config)
    run, data = config["run"], config["data"]
    train, _ = split(p.source(**data["kwargs"]), data["eval_fraction"], run["seed"])
    batches = Batches(train, data["batch_size"], run["seed"])
    steps = steps or run.get("steps") or run["epochs"] * batches.steps_per_epoch
    distgrad.manual_seed(run["seed"])
    model = p.factory(**config["model"]["kwargs"])
    optimizer = p.optimizer(model.parameters(), **p.optimizer_kwargs)
    loss_fn = LOSSES[config["model"]["loss"]]()
    count = config["pipeline"]["micro_batches"]
    # the stages' order of backward passes, which is the order their gradients add up in
    reverse = backward_reversed(config["pipeline"]["schedule"])
    losses = []
    aux_weight = config["model"]["aux_weight"]
    # as the stages do: linear weights' gradients once per step (plan.deferred_weight_names)
    deferred = deferred_weights(model, p.deferred_weight_names) or nullcontext()
    for step in range(steps):
        x, y = batches.batch(step)
        total = 0.0
        outputs = []
        later = []  # losses whose backward runs after every forward (in reverse)
        with deferred:
            for xm, ym in zip(micro_batches(x, count), micro_batches(y, count)):
                z = model(distgrad.from_numpy(xm))
                loss = loss_fn(z, distgrad.from_numpy(ym)) * (len(ym) / len(y))
                if reverse:
                    later.append(loss)
                else:
                    loss.backward(retain_graph=aux_weight > 0)
                total += loss.item()
                if aux_weight:
                    outputs.append((z, len(ym)))
            for loss in reversed(later):
                loss.backward()
        if aux_weight:
            _auxiliary_backward(model, outputs, aux_weight, len(y))
        for hook, kwargs in p.hooks:
            hook(model, **kwargs)
        optimizer.step()
        optimizer.zero_grad()
        losses.append(total)
        if on_step is not None:
            on_step(step, total)
    return losses


def _auxiliary_backward(model, outputs, weight, total):
    """The auxiliary losses' backward over the kept graphs: their gradients are summed
    on their own, then added to the main ones (the order of the distributed sums)."""
    params = list(model.parameters())
    main = [p.grad for p in params]
    for p in params:
        p.grad = None
    for z, count in outputs:
        auxiliary_loss(z, weight, count, total).backward()
    for p, g in zip(params, main):
        if g is not None and p.grad is not None:
            p.grad = g + p.grad
        elif g is not None:
            p.grad = g

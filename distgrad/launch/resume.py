"""``--resume``: which run directory a launch continues, and whether there is anything to do.

A run can be continued only by the training it is a checkpoint of: the same model,
stage layout, optimizer (a checkpoint restores the optimizer's arguments with its
state: an ``optim.lr`` given on resuming would be ignored), data, seed,
micro-batches and hooks (:data:`TRAINING`). The rest may change between a stop and
its resume: ``run.steps`` (to train longer), logging, checkpoint frequency,
timeouts, transport, offloading.

Without a run directory (``--run-dir``, or the one a Slurm or torchrun job names),
``--resume`` takes the newest run of the config's name that this config continues,
and says why it passed over newer ones; when none fits it stops and says why,
instead of continuing another training. A named run directory that does not fit
is an error. A run that already finished as many steps as the config asks for is
reported complete, and nothing starts (its files stay as they are).

>>> differences({"optim": {"name": "Adam", "lr": 0.1}}, {"optim": {"name": "Adam", "lr": 0.2}},
...             TRAINING)
[('optim.lr', 0.1, 0.2)]
"""
import os
import time

from . import checkpoint as ckpt
from .data import Batches, split
from .grid import Grid
from .rundir import LAUNCH, RESULT, read_json

__all__ = ["ResumeError", "Place", "place", "differences", "TRAINING"]

#: what makes a training (dotted prefixes); the stage layout a checkpoint holds is
#: also compared with its manifest
TRAINING = ("model", "world.strategy", "world.workers", "world.replicas", "optim", "data",
            "run.seed", "pipeline.micro_batches", "hooks")

_MISSING = object()


class ResumeError(ValueError):
    """``--resume`` cannot continue any run with this config; the message says why."""


class Place:
    """Where a launch runs: ``run_dir``, the checkpoint to resume from (or None), and
    ``complete`` (a step count) when the run already did everything asked of it."""

    def __init__(self, run_dir, resume_from=None, complete=None):
        self.run_dir, self.resume_from, self.complete = run_dir, resume_from, complete


def _flatten(value, prefix):
    if isinstance(value, dict):
        out = {}
        for key, item in value.items():
            out.update(_flatten(item, f"{prefix}.{key}" if prefix else key))
        return out
    return {prefix: value}


def differences(saved, config, prefixes):
    """``[(dotted key, saved value, this config's value)]`` under ``prefixes``."""
    def within(key):
        return any(key == p or key.startswith(p + ".") for p in prefixes)
    old, new = _flatten(saved, ""), _flatten(config, "")
    return [(key, old.get(key), new.get(key))
            for key in sorted(k for k in set(old) | set(new) if within(k))
            if old.get(key, _MISSING) != new.get(key, _MISSING)]


def _describe(diffs, limit=4):
    shown = [f"{key} {old!r} (here {new!r})" for key, old, new in diffs[:limit]]
    more = f" and {len(diffs) - limit} more" if len(diffs) > limit else ""
    return ", ".join(shown) + more


class _Run:
    """What a run directory says about itself: its config, last checkpoint and result."""

    def __init__(self, path):
        self.path = path
        launch = read_json(os.path.join(path, LAUNCH)) or {}
        self.config, self.overrides = launch.get("config"), launch.get("overrides") or []
        self.result = read_json(os.path.join(path, RESULT))
        self.checkpoint = ckpt.latest(path)  # (directory, manifest) or None
        files = [os.path.join(self.checkpoint[0], ckpt.MANIFEST)] if self.checkpoint else []
        if self.finished_step is not None:
            files.append(os.path.join(path, RESULT))
        self.when = max((_mtime(f) for f in files), default=None)  # None: nothing to resume

    @property
    def finished_step(self):
        result = self.result or {}
        return result.get("step") if result.get("status") == "finished" else None

    def why_not(self, config, plan):
        """Why ``config`` cannot continue this run, or None."""
        diffs = differences(self.config, config, TRAINING) if self.config is not None else []
        if diffs:
            return f"trained with {_describe(diffs)}"
        if self.checkpoint is not None:
            manifest = self.checkpoint[1]
            grid = Grid.of(config)
            saved = (manifest.get("stages"), manifest.get("replicas"), manifest.get("balance"))
            if saved != (grid.stages, grid.replicas, plan.balance):
                return (f"its checkpoint at step {manifest.get('step')} holds {saved[0]} "
                        f"stage(s) x {saved[1]} replica(s), layers per stage {saved[2]}; "
                        f"this config makes {grid.stages} x {grid.replicas}, layers per "
                        f"stage {plan.balance}")
        if self.config is None and self.checkpoint is None:
            return f"it has no {LAUNCH}"
        return None

    def __str__(self):
        return self.path + (f" (overrides: {' '.join(self.overrides)})" if self.overrides
                            else "")


def _mtime(path):
    try:
        return os.path.getmtime(path)
    except OSError:  # pruned meanwhile: as old as can be
        return 0.0


def _total_steps(config, plan):
    """The step count ``config`` trains to (what the coordinator computes)."""
    run = config["run"]
    if run.get("steps"):
        return run["steps"]
    data = config["data"]
    train, _ = split(plan.source(**data["kwargs"]), data["eval_fraction"], run["seed"])
    return run["epochs"] * Batches(train, data["batch_size"], run["seed"],
                                   Grid.of(config).replicas).steps_per_epoch


def _finished(run, config, plan):
    """The step ``run`` finished at when that is all ``config`` asks for, else None."""
    step = run.finished_step
    if step is None:
        return None
    return step if step >= _total_steps(config, plan) else None


def _candidates(parent, name):
    """The runs of this name with something to resume from, newest first."""
    try:
        entries = os.listdir(parent)
    except OSError:
        return []
    runs = []
    for entry in entries:
        path = os.path.join(parent, entry)
        if entry.startswith(name + "-") and os.path.isdir(path):
            run = _Run(path)
            saved_name = (run.config or {}).get("run", {}).get("name", name)
            if run.when is not None and saved_name == name:
                runs.append(run)
    return sorted(runs, key=lambda r: r.when, reverse=True)


def _new_run_dir(parent, name):
    stamp = time.strftime("%Y%m%d-%H%M%S")
    path = os.path.join(parent, f"{name}-{stamp}")
    n = 1
    while True:
        try:
            os.makedirs(path)
            return path
        except FileExistsError:
            n += 1
            path = os.path.join(parent, f"{name}-{stamp}-{n}")


def _pick(parent, name, config, plan, note):
    """The newest run of ``name`` under ``parent`` that ``config`` continues, or None."""
    candidates = _candidates(parent, name)
    passed = []
    for run in candidates:
        why = run.why_not(config, plan)
        if why is None:
            for other, reason in passed:
                note(f"--resume passes over {other}: {reason}")
            return run
        passed.append((run, why))
    if passed:
        lines = "\n".join(f"  {run}: {reason}" for run, reason in passed[:5])
        raise ResumeError(
            f"--resume: no run of {name!r} in {parent} continues this config's training:\n"
            f"{lines}\nresume one with the overrides it was launched with, or start a new run "
            f"without --resume")
    return None


def place(config, plan, *, resume, run_dir=None, run_id=None, note=print):
    """The :class:`Place` of a launch of ``config`` (its resolved ``plan``).

    ``run_dir``: the directory the user named; ``run_id``: the one a scheduler's job
    names (``<run.dir>/<run.name>-<run_id>``); ``note(text)`` tells the user what
    was chosen and why. Raises :class:`ResumeError` when nothing fits.
    """
    run_cfg = config["run"]
    parent, name = run_cfg["dir"], run_cfg["name"]
    path = run_dir or (os.path.join(parent, f"{name}-{run_id}") if run_id else None)
    if not resume:
        if path is None:
            return Place(_new_run_dir(parent, name))
        os.makedirs(path, exist_ok=True)
        return Place(path)
    if path is None:
        run = _pick(parent, name, config, plan, note)
        if run is None:
            note(f"nothing to resume: no checkpoint in {parent}/{name}-*; starting a new run")
            return Place(_new_run_dir(parent, name))
    else:
        run = _Run(path)
        if run.when is None:
            os.makedirs(path, exist_ok=True)
            note(f"nothing to resume in {path}: starting from step 0")
            return Place(path)
        why = run.why_not(config, plan)
        if why is not None:
            raise ResumeError(f"--resume: {run} cannot be continued with this config: {why}; "
                              f"resume it with the overrides it was launched with")
    step = _finished(run, config, plan)
    if step is not None:
        return Place(run.path, complete=step)
    if run.checkpoint is None:  # finished, without a checkpoint to go on from
        why = (f"{run.path} finished at step {run.finished_step} and has no checkpoint to "
               f"go on from (checkpoint.every = 0)")
        if path is not None:
            raise ResumeError(f"--resume: {why}")
        note(f"{why}: starting a new run")
        return Place(_new_run_dir(parent, name))
    return Place(run.path, run.checkpoint[0])

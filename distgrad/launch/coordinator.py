"""Rank 0 of a launch: trains the model through its workers, whatever the strategy.

The supervisor starts it as ``python -m distgrad.launch.rank0 RUN_DIR``, which
reads ``RUN_DIR/launch.json`` (the resolved config and the world to join), joins
the RPC world and runs :class:`Coordinator`. How the steps reach the workers is the
strategy's (``world.strategy``): :class:`~distgrad.launch.pipeline_strategy.PipelineStrategy`
("pipeline", "ddp": the workers' stages run a pipeline schedule, a run of steps per
command) or :class:`~distgrad.launch.autograd_strategy.AutogradStrategy` ("autograd": this
process drives each step through distributed autograd). What is the coordinator's, for
both:

- the batches, in order, and a command of steps sent before the current one finishes
  (``run.in_flight``), so the coordinator's own latency is hidden;
- an evaluation (``run.eval_every``) is sent after its step and before any later one,
  so it sees the parameters of its step;
- every ``checkpoint.every`` steps, and on a graceful stop (SIGTERM or SIGINT:
  stop at the next step boundary), every stage (of replica 0: the replicas are
  identical) saves its state and then the manifest marks the checkpoint complete;
- losses and accuracies go to ``metrics.jsonl``; with ``trace`` set, the events of
  every process become one Chrome trace.

When a stage fails (:class:`~distgrad.launch.stage_calls.StageFailure`) rank 0 writes
``failure.json`` (the worker, the step, the error and the remote traceback) for the
supervisor and exits with status 1.
"""
import json
import os
import threading
import time
from collections import deque

from distgrad.distributed import rpc

from . import board as _board
from . import checkpoint as ckpt
from . import schedule as schedules
from . import progress
from . import stage as _stage
from . import trace as _trace
from .autograd_strategy import AutogradStrategy
from .contracts import ModelSlice
from .data import Batches, split
from .grid import Grid
from .pipeline_strategy import PipelineStrategy
from .resolve import plan
from .rundir import METRICS, RESULT, write_json
from .stage_calls import StageCalls

__all__ = ["Coordinator", "STRATEGIES"]

#: ``world.strategy`` -> how the steps reach the workers
STRATEGIES = {"pipeline": PipelineStrategy, "ddp": PipelineStrategy,
              "autograd": AutogradStrategy}


class Coordinator:
    """Rank 0's training run: the state and the loop both strategies share; ``strategy``
    (made here from ``world.strategy``) sets the workers up and runs the steps, and
    ``calls`` (:class:`~distgrad.launch.stage_calls.StageCalls`) sends its commands and
    names the worker at fault when one fails."""

    def __init__(self, run_dir, launch):
        self.run_dir, self.launch = run_dir, launch
        self.config = config = launch["config"]
        self.plan = plan(config)
        self.workers = launch["world"]["workers"]  # worker index -> worker name
        self.grid = Grid.of(config)
        self.stop_requested = threading.Event()
        self.trace = _trace.Recorder(bool(launch.get("trace")))
        self.timeout = config["world"]["rpc_timeout"]
        self.micro = config["pipeline"]["micro_batches"]
        self.virtual = config["pipeline"].get("virtual_stages", 1)
        last = self.grid.stages * self.virtual - 1  # the last stage: on the last rank, or
        self.last_rank = next(r for r in range(self.grid.stages)  # the first (V schedules)
                              if last in self.stages_of(r))
        data = config["data"]
        train, held_out = split(self.plan.source(**data["kwargs"]), data["eval_fraction"],
                                config["run"]["seed"])
        self.batches = Batches(train, data["batch_size"], config["run"]["seed"],
                               self.grid.replicas)
        self.held_out = held_out
        run = config["run"]
        self.total = run.get("steps") or run["epochs"] * self.batches.steps_per_epoch
        self.resume_from = launch.get("resume_from")
        self.start = 0
        if self.resume_from:
            self.start = int(ckpt.read_manifest(self.resume_from)["step"])
        self.metrics = None
        self.board = None  # TensorBoard event files of the metrics (with tensorboard)
        self.last_step = self.start
        x, y = train
        self.command_size = progress.CommandSize(
            (x[:1].nbytes + y[:1].nbytes) * data["batch_size"])
        # the steps that raised on a stage (this process serves progress.failed)
        self.failed_steps = progress.FailedSteps(len(self.workers))
        progress.install(self.failed_steps)
        self.calls = StageCalls(self.workers, self.grid, self.timeout,
                                config["world"]["heartbeat_timeout"])
        self.strategy = STRATEGIES[config["world"]["strategy"]](self)

    def model_slice(self, stages):
        """The :class:`~distgrad.launch.contracts.ModelSlice` of the model's ``stages``
        (stage indices), as this run's config and plan describe it."""
        model = self.config["model"]
        return ModelSlice(factory=self.plan.factory, factory_kwargs=model["kwargs"],
                          seed=self.config["run"]["seed"],
                          parts=[(s, *self.plan.layers[s]) for s in stages],
                          checkpoint_activations=model["checkpoint_activations"],
                          deferred_weights=list(self.plan.deferred_weight_names))

    def stages_of(self, rank):
        """The stages pipeline rank ``rank`` holds (``pipeline.virtual_stages`` of them)."""
        return schedules.stage_indices(self.config["pipeline"]["schedule"], rank,
                                       self.grid.stages, self.virtual)

    def _checkpoint_dir(self, step_count):
        directory = ckpt.step_dir(self.run_dir, step_count)
        os.makedirs(directory, exist_ok=True)
        return directory

    def _save(self, step_count):
        directory = self._checkpoint_dir(step_count)
        return directory, self.strategy.save(directory, step_count)

    def _complete_save(self, directory, futures, step_count):
        self.calls.gather(futures, step_count - 1)
        ckpt.write_manifest(directory, {"step": step_count, "stages": self.grid.stages,
                                        "replicas": self.grid.replicas,
                                        "balance": self.plan.balance,
                                        "config": self.config["run"]["name"]})
        ckpt.prune(self.run_dir, self.config["checkpoint"]["keep"])
        print(f"checkpoint at step {step_count}: {os.path.relpath(directory, self.run_dir)}",
              flush=True)

    def evaluate(self, step_count):
        x, y = self.held_out
        if len(x) == 0:
            return None
        chunk = self.config["data"]["batch_size"] * 4
        loss = correct = 0.0
        for i, start in enumerate(range(0, len(x), chunk)):
            key = -(step_count * 1000 + i + 1)  # negative: never a training step's key
            part = x[start:start + chunk], y[start:start + chunk]
            for out in self.strategy.evaluate_part(key, part, step_count):
                loss += out.loss * out.count
                correct += out.correct
        record = {"step": step_count, "eval_loss": loss / len(x)}
        if self.config["model"]["loss"] == "cross_entropy":
            record["eval_accuracy"] = correct / len(x)
        self._log(record)
        print("eval  step {step}  loss {eval_loss:.4f}".format(**record)
              + (f"  accuracy {record['eval_accuracy']:.4f}" if "eval_accuracy" in record
                 else ""), flush=True)
        return record

    def _log(self, record):
        self.metrics.write(json.dumps(record) + "\n")
        self.metrics.flush()
        if self.board is not None:
            self.board.write(record)

    def _open_metrics(self):
        path = os.path.join(self.run_dir, METRICS)
        kept = []
        if self.start and os.path.exists(path):  # drop what came after the checkpoint
            with open(path, encoding="utf-8") as fh:
                for line in fh:
                    try:
                        rec = json.loads(line)
                    except ValueError:
                        continue
                    if rec.get("step", 0) <= self.start:
                        kept.append(line if line.endswith("\n") else line + "\n")
        # a new file, renamed into place: a reader of the old one sees it replaced
        tmp = f"{path}.tmp-{os.getpid()}"
        self.metrics = open(tmp, "w", encoding="utf-8")
        self.metrics.writelines(kept)
        self.metrics.flush()
        os.replace(tmp, path)
        self.board = _board.open_board(self.run_dir, self.start)
        self._log({"event": "start", "step": self.start, "total_steps": self.total,
                   "batch_size": self.config["data"]["batch_size"],
                   "stages": self.grid.stages, "replicas": self.grid.replicas,
                   "time": time.time()})

    def train(self):
        every, eval_every = self.config["checkpoint"]["every"], self.config["run"]["eval_every"]
        in_flight = self.config["run"]["in_flight"]
        pending = deque()  # (kind, step, steps in it, what was sent), in command order
        step = self.start
        self._started = self._window_start = self._last_done = time.perf_counter()
        self._window_steps = 0
        while step < self.total or pending:
            while step < self.total and len(pending) < in_flight \
                    and not self.stop_requested.is_set() \
                    and not (pending and pending[-1][0] == "eval"):
                count = min(self.strategy.steps_per_command(), self.total - step,
                            *(n - step % n for n in (every, eval_every) if n))
                pending.append(("steps", step, count, self.strategy.issue_steps(step, count)))
                step += count
                if every and step % every == 0:  # stages save in command order: after it
                    pending.append(("save", step, 0, self._save(step)))
                if eval_every and step % eval_every == 0 and step < self.total:
                    # nothing is sent after it before it ran: it sees this step's parameters
                    pending.append(("eval", step, 0, None))
            if not pending:
                break
            kind, at, count, sent = pending.popleft()
            if kind == "save":
                self._complete_save(*sent, at)
            elif kind == "eval":
                self.evaluate(at)
            else:
                previous = self._last_done
                for i, (out, when) in enumerate(self.strategy.complete_steps(at, count, sent)):
                    self._log_step(at + i, out, when)
                self.command_size.observe(count, self._last_done - previous)
        return self.last_step

    def _log_step(self, step, out, when):
        self.last_step, self._last_done = step + 1, when
        self._window_steps += 1
        record = {"step": step + 1, "loss": out["loss"]}
        if self.config["model"]["loss"] == "cross_entropy" and out["count"]:
            record["accuracy"] = out["correct"] / out["count"]
        record.update((k, v) for k, v in out.items() if "." in k or k == "aux_loss")
        batch = self.config["data"]["batch_size"]
        record["samples_per_s"] = self._window_steps * batch / max(when - self._window_start,
                                                                    1e-9)
        record["elapsed"] = when - self._started
        self._log(record)
        if (step + 1) % self.config["run"]["log_every"] == 0 or step + 1 == self.total:
            self._window_start, self._window_steps = when, 0
            print(f"step {step + 1}/{self.total}  loss {record['loss']:.4f}"
                  + (f"  accuracy {record['accuracy']:.3f}" if "accuracy" in record else "")
                  + f"  {record['samples_per_s']:.0f} samples/s", flush=True)

    def _collect_trace(self):
        """Each stage's events and clock offset, merged into the trace file."""
        samples = {k: [] for k in range(len(self.workers))}
        for _ in range(8):
            for k, w in enumerate(self.workers):
                t0 = _trace.Recorder.now()
                remote = rpc.rpc_sync(w, _stage.clock, timeout=self.timeout)
                samples[k].append((t0, remote, _trace.Recorder.now()))
        events = self.strategy.finish()
        procs = {0: self.trace.take()}
        offsets = {0: 0}
        for k, ev in enumerate(events):
            procs[k + 1] = [tuple(e) for e in ev]
            offsets[k + 1] = _trace.offset_from_samples(samples[k])[0]
        offsets = _trace.align(offsets, procs)
        names = ["0:coordinator"] + [f"{k + 1}:{w} ({self.grid.describe(k)})" for k, w in
                                     enumerate(self.workers)]
        _trace.write_chrome_trace(self.launch["trace"], [
            {"pid": r, "name": names[r], "offset": offsets[r] - offsets[0], "events": procs[r]}
            for r in sorted(procs)])
        print(f"trace: {self.launch['trace']}", flush=True)

    def run(self):
        try:
            return self._run()
        finally:
            self.strategy.close()

    def _run(self):
        info = self.strategy.setup()
        stages = self.grid.stages
        held = [", ".join(map(str, self.stages_of(k))) for k in range(stages)]
        sizes = ", ".join(f"stage{'s' if self.virtual > 1 else ''} {held[k]}: "
                          f"{i.parameters:,}" for k, i in enumerate(info[:stages]))
        copies = f" x {self.grid.replicas} replicas" if self.grid.replicas > 1 else ""
        n = stages * self.virtual
        print(f"{n} stage{'s' if n > 1 else ''}{copies} ({sizes} parameters); steps "
              f"{self.start + 1}..{self.total}"
              + (f", resumed from {self.resume_from}" if self.resume_from else ""), flush=True)
        self._open_metrics()
        try:
            with self.trace.span("train", lane="steps"):
                step_count = self.train()
            stopped = self.stop_requested.is_set() and step_count < self.total
            if (stopped or self.config["checkpoint"]["every"]) and step_count > self.start \
                    and not os.path.exists(os.path.join(ckpt.step_dir(self.run_dir, step_count),
                                                        ckpt.MANIFEST)):
                directory, futures = self._save(step_count)
                self._complete_save(directory, futures, step_count)
            final = None if stopped else self.evaluate(step_count)
            if self.launch.get("trace"):
                self._collect_trace()
            else:
                self.strategy.finish()
        finally:
            self.metrics.close()
            if self.board is not None:
                self.board.close()
        result = {"status": "stopped" if stopped else "finished", "step": step_count,
                  "total_steps": self.total}
        if final:
            result.update(final)
        write_json(os.path.join(self.run_dir, RESULT), result)
        return result


"""Rank 0 of a launch: drives the pipeline stages (of every replica) through training.

The supervisor starts it as ``python -m distgrad.launch.rank0 RUN_DIR``, which
reads ``RUN_DIR/launch.json`` (the resolved config and the world to join), joins
the RPC world, sets up one stage per worker and runs the steps:

- each step's inputs go to the first stage and its targets to the last; with
  data-parallel replicas (``world.replicas``, or ``world.strategy = "ddp"``) each
  replica's first and last stage get its shard of them, the replicas average their
  gradients among themselves, and the coordinator serves the store through which
  they meet (it trains no replica itself: it stays free to send ahead, watch and
  checkpoint, and every replica runs the same code); a command carries a run of
  steps (about 20 ms of them, ``progress.py``), and the next is sent before the
  current one finishes (``run.in_flight``), so the coordinator's own latency is
  hidden;
- an evaluation (``run.eval_every``) is sent after its step and before any later one,
  so it sees the parameters of its step;
- every ``checkpoint.every`` steps, and on a graceful stop (SIGTERM or SIGINT:
  stop at the next step boundary), every stage (of replica 0: the replicas are identical) saves its
  state and then the manifest marks the checkpoint complete;
- losses and accuracies go to ``metrics.jsonl``; with ``trace`` set, the events of
  every process become one Chrome trace.

When a stage fails it writes ``failure.json`` (the worker, the step, the error
and the remote traceback) for the supervisor and exits with status 1.
"""
import json
import os
import threading
import time
from collections import deque

from distgrad.distributed import TCPStore, rpc
from distgrad.futures import wait_all

from . import board as _board
from . import checkpoint as ckpt
from . import schedule as schedules
from . import progress
from . import stage as _stage
from . import trace as _trace
from .contracts import ContractError, ModelSlice, PipelineSetup, StepResult, StepWork
from .data import Batches, micro_batches, split
from .environment import own_address
from .grid import Grid
from .resolve import plan
from .rundir import METRICS, RESULT, write_json

__all__ = ["Coordinator", "StageFailure"]


_FAILURE_NOTICE = 1.0  # s: how long a stage's word of the step that raised may take
_NEIGHBOUR = "StageFailedError"  # the error of a stage whose neighbour failed first


class StageFailure(Exception):
    """A stage failed or became unreachable; carries what the supervisor reports."""

    def __init__(self, record):
        super().__init__(record["message"])
        self.record = record


def _error_of(future):
    if not future.done():
        return None
    try:
        future.value()
    except Exception as e:  # noqa: BLE001 - the caller decides what it means
        return e
    return None


class Coordinator:
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
                              if last in self._stages_of(r))
        self.seq = 0
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
        self.store = None  # where the replicas meet (replicas > 1)
        x, y = train
        self.command_size = progress.CommandSize(
            (x[:1].nbytes + y[:1].nbytes) * data["batch_size"])
        # the steps that raised on a stage (this process serves progress.failed)
        self.failed_steps = progress.FailedSteps(len(self.workers))
        progress.install(self.failed_steps)

    # -- commands to every stage --
    def _next_seq(self):
        self.seq += 1
        return self.seq

    def _to_all(self, fn, args_of, timeout=None):
        """Send ``fn(*args_of(stage))`` to every stage; return the futures."""
        return [rpc.rpc_async(w, fn, args_of(k), timeout=self.timeout if timeout is None
                              else timeout) for k, w in enumerate(self.workers)]

    def _gather(self, futures, step):
        """The results of one command on every stage, or StageFailure naming the culprit.

        Waits for all futures but stops at the first error: a stage that is waiting
        for a dead neighbour would otherwise keep this waiting until its timeout.
        """
        try:
            return wait_all(futures)
        except Exception:  # noqa: BLE001 - the first that failed names its stage
            failed = self._failed(futures)
            raise self._diagnose(*failed[0], step) from None

    @staticmethod
    def _failed(futures):
        """``[(worker index, error)]`` of the futures that failed, a stage's own error
        first: a stage whose neighbour failed raises too (StageFailedError), and may be
        heard first; its neighbour's answer is given a moment to arrive."""
        def failed():
            errors = [(k, _error_of(f)) for k, f in enumerate(futures)]
            errors = [(k, e) for k, e in errors if e is not None]
            return sorted(errors, key=lambda ke: _NEIGHBOUR in (getattr(ke[1], "remote_type",
                                                                        None) or ""))
        errors = failed()
        deadline = time.monotonic() + _FAILURE_NOTICE
        while _NEIGHBOUR in (getattr(errors[0][1], "remote_type", None) or "") and \
                time.monotonic() < deadline and not all(f.done() for f in futures):
            next(f for f in futures if not f.done()).wait_done(0.05)
            errors = failed()
        return errors

    def _diagnose(self, stage, error, step):
        """Which worker is at fault: a probe finds a dead or stopped one within the
        heartbeat bound; otherwise the stage whose call raised."""
        hb = self.config["world"]["heartbeat_timeout"]
        probes = [rpc.rpc_async(w, _stage.clock, timeout=hb + 2.0) for w in self.workers]
        culprit, reason, message = stage, "error", str(error)
        for k, p in enumerate(probes):
            try:
                p.wait()
            except Exception as e:  # noqa: BLE001 - unreachable or timed out: this one
                culprit, reason, message = k, "unreachable", str(e)
                break
        text, _, remote_tb = message.partition("\n\nRemote traceback")
        traceback = remote_tb.partition(":\n")[2] if remote_tb else ""
        if reason == "error":  # name the exception's class, as a traceback's last line does
            kind = getattr(error, "remote_type", None) or type(error).__name__
            if not text.startswith(kind):
                text = f"{kind.removeprefix('builtins.')}: {text}"
            traceback = getattr(error, "remote_traceback", None) or traceback
        return StageFailure({
            "worker": self.workers[culprit], "rank": culprit + 1,
            "place": self.grid.describe(culprit),
            "step": step + 1, "reason": reason, "message": text.strip(),
            "traceback": traceback})

    # -- setup --
    def _setup(self):
        config, p, grid = self.config, self.plan, self.grid
        stages, world = grid.stages, config["world"]
        if grid.replicas > 1:
            bind = own_address(self.launch["world"]["init_method"],
                               self.launch["world"].get("bind_addr") or world["bind_addr"])
            self.store = TCPStore(bind, 0, is_master=True, wait_for_workers=False,
                                  timeout=world["rendezvous_timeout"])

        def spec(w):
            replica, k = grid.place(w)
            return (PipelineSetup(
                model=self.model_slice(self._stages_of(k)), worker=w, stage=k, stages=stages,
                num_stages=stages * self.virtual,
                pipeline=[self.workers[grid.index(replica, r)] for r in range(stages)],
                replica=replica, replicas=grid.replicas,
                store=(self.store.host, self.store.port) if self.store else None,
                schedule=config["pipeline"]["schedule"], optimizer=p.optimizer,
                optimizer_kwargs=p.optimizer_kwargs, loss=config["model"]["loss"],
                hooks=[tuple(h) for h in p.hooks], offload=config["offload"] or {},
                heartbeat_timeout=world["heartbeat_timeout"],
                rendezvous_timeout=world["rendezvous_timeout"],
                simulated_link=world.get("simulated_link"), timeout=self.timeout,
                trace=self.trace.enabled, resume_from=self.resume_from),)
        return self._gather(self._to_all(_stage.setup, spec), self.start - 1)

    def model_slice(self, stages):
        """The :class:`~distgrad.launch.contracts.ModelSlice` of the model's ``stages``
        (stage indices), as this run's config and plan describe it."""
        model = self.config["model"]
        return ModelSlice(factory=self.plan.factory, factory_kwargs=model["kwargs"],
                          seed=self.config["run"]["seed"],
                          parts=[(s, *self.plan.layers[s]) for s in stages],
                          checkpoint_activations=model["checkpoint_activations"],
                          deferred_weights=list(self.plan.deferred_weight_names))

    # -- steps --
    def _shard_work(self, key, shards, count):
        """For each worker: the :class:`~distgrad.launch.contracts.StepWork` of step (or
        evaluation batch) ``key`` on its replica's shard; a shard smaller than ``count``
        has as many micro-batches as samples."""
        per_replica = []
        for x, y in shards:
            n = min(count, len(x))
            per_replica.append((n, micro_batches(x, n) if n else [],
                                micro_batches(y, n) if n else []))
        out = []
        for w in range(len(self.workers)):
            replica, k = self.grid.place(w)
            n, xs, ys = per_replica[replica]
            out.append(StepWork(step=key, micro_batches=n, inputs=xs if k == 0 else None,
                                targets=ys if k == self.last_rank else None))
        return out

    def _stages_of(self, rank):
        """The stages pipeline rank ``rank`` holds (``pipeline.virtual_stages`` of them)."""
        return schedules.stage_indices(self.config["pipeline"]["schedule"], rank,
                                       self.grid.stages, self.virtual)

    def _combine(self, results):
        """The last stages' results (:class:`~distgrad.launch.contracts.StepResult`) of
        every replica, as the whole batch's metrics."""
        last = [results[self.grid.index(r, self.last_rank)] for r in range(self.grid.replicas)]
        # equal shards: the mean of the replicas' means (one replica: its loss, bit for bit)
        out = {"loss": sum(r.loss for r in last) / len(last),
               "correct": sum(r.correct for r in last),
               "count": sum(r.count for r in last)}
        for r in results[:self.grid.stages]:  # replica 0's hook values (all replicas agree)
            out.update(r.reported)
        return out

    def _issue_steps(self, first, count):
        """Send steps ``first .. first + count - 1`` to every stage, as one command each."""
        work = [self._shard_work(s, self.batches.shards(s), self.micro)
                for s in range(first, first + count)]
        seq = self._next_seq()
        futures = []
        for k, w in enumerate(self.workers):
            self.trace.message("send", "input", _trace.flow_id("input", first, 0, k))
            steps = [work[s - first][k] for s in range(first, first + count)]
            futures.append(rpc.rpc_async(w, _stage.step, (seq, steps), timeout=self.timeout))
        return futures

    def _steps_per_command(self):
        return self.command_size.steps()

    def _complete_steps(self, first, count, futures):
        """Wait for a command of ``count`` steps from ``first``; returns ``(the whole
        batch's result, when it finished)`` of each."""
        try:
            results = self._gather(futures, first)
        except StageFailure as failure:
            culprit = self.workers.index(failure.record["worker"])
            at = self.failed_steps.take(culprit, _FAILURE_NOTICE)
            if at is not None:  # else: it died, in the first step that did not complete
                failure.record["step"] = at + 1
            raise
        now = time.perf_counter()
        for k, r in enumerate(results):
            if not (isinstance(r, list) and len(r) == count
                    and all(isinstance(x, StepResult) for x in r)):
                raise self._diagnose(k, ContractError(
                    f"a command of {count} steps was answered with {type(r).__name__} "
                    f"{str(r)[:80]}, not {count} StepResult"), first)
            self.trace.message("receive", "result", _trace.flow_id("result", first, 0, k))
        # a step is done once every stage finished it
        return [(self._combine([r[i] for r in results]),
                 now - min(r[i].seconds_ago for r in results)) for i in range(count)]

    def _checkpoint_dir(self, step_count):
        directory = ckpt.step_dir(self.run_dir, step_count)
        os.makedirs(directory, exist_ok=True)
        return directory

    def _save(self, step_count):
        directory = self._checkpoint_dir(step_count)
        seq = self._next_seq()
        return directory, self._to_all(_stage.save, lambda k: (seq, directory, step_count))

    def _complete_save(self, directory, futures, step_count):
        self._gather(futures, step_count - 1)
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
            for out in self._evaluate_part(key, part, step_count):
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

    def _evaluate_part(self, key, part, step_count):
        """The :class:`~distgrad.launch.contracts.StepResult` of every replica on its
        share of ``part``."""
        replicas = self.grid.replicas
        work = self._shard_work(  # each replica evaluates a share of the chunk
            key, [(part[0][r::replicas], part[1][r::replicas]) for r in range(replicas)],
            self.micro)
        seq = self._next_seq()
        results = self._gather(self._to_all(
            _stage.evaluate, lambda k: (seq, work[k])), step_count - 1)
        return [results[self.grid.index(r, self.last_rank)] for r in range(replicas)]

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
                count = min(self._steps_per_command(), self.total - step,
                            *(n - step % n for n in (every, eval_every) if n))
                pending.append(("steps", step, count, self._issue_steps(step, count)))
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
                for i, (out, when) in enumerate(self._complete_steps(at, count, sent)):
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

    def _finish(self):
        """Every stage lets go of what it holds (the replicas' process group, offloaded
        activations); returns their trace events."""
        seq = self._next_seq()
        return self._gather(self._to_all(_stage.finish, lambda k: (seq,)), self.last_step)

    def _collect_trace(self):
        """Each stage's events and clock offset, merged into the trace file."""
        samples = {k: [] for k in range(len(self.workers))}
        for _ in range(8):
            for k, w in enumerate(self.workers):
                t0 = _trace.Recorder.now()
                remote = rpc.rpc_sync(w, _stage.clock, timeout=self.timeout)
                samples[k].append((t0, remote, _trace.Recorder.now()))
        events = self._finish()
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
            if self.store is not None:
                self.store.close()

    def _run(self):
        info = self._setup()
        stages = self.grid.stages
        held = [", ".join(map(str, self._stages_of(k))) for k in range(stages)]
        sizes = ", ".join(f"stage{'s' if self.virtual > 1 else ''} {held[k]}: "
                          f"{i['parameters']:,}" for k, i in enumerate(info[:stages]))
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
                self._finish()
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


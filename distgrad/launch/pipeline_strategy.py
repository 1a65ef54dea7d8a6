"""``world.strategy = "pipeline"`` (and ``"ddp"``): the coordinator trains through the
workers' pipeline stages (:mod:`distgrad.launch.stage`).

Each worker holds its stages and runs ``distgrad.distributed.pipelining``'s schedule with
the other workers of its pipeline; the coordinator only sets them up, sends each
command (a run of steps: their inputs to the first stage, their targets to the last,
:class:`~distgrad.launch.contracts.StepWork`) and collects the answers
(:class:`~distgrad.launch.contracts.StepResult`). With data-parallel replicas
(``world.replicas``, or ``"ddp"``) each replica's first and last stage get its shard of a
batch, and the replicas meet through a store this process serves.

A strategy is what :class:`~distgrad.launch.coordinator.Coordinator` (``run`` here)
asks of it: ``setup``, ``steps_per_command``, ``issue_steps`` / ``complete_steps``,
``evaluate_part``, ``save``, ``finish`` and ``close``; batches, metrics, evaluation,
checkpoints, resume, traces and failure reports are the coordinator's.
"""
import time

from distgrad.distributed import TCPStore, rpc

from . import stage as _stage
from . import trace as _trace
from .contracts import ContractError, PipelineSetup, StepResult, StepWork
from .data import micro_batches
from .environment import own_address
from .stage_calls import FAILURE_NOTICE, StageFailure

__all__ = ["PipelineStrategy"]


class PipelineStrategy:
    """Training through pipeline stages, for the coordinator ``run``."""

    def __init__(self, run):
        self.run = run
        self.calls, self.grid, self.workers = run.calls, run.grid, run.workers
        self.store = None  # where the replicas meet (replicas > 1)

    def setup(self):
        """Every worker's stages built (:func:`distgrad.launch.stage.setup`); their sizes."""
        run, grid = self.run, self.grid
        config, p = run.config, run.plan
        stages, world = grid.stages, config["world"]
        if grid.replicas > 1:
            bind = own_address(run.launch["world"]["init_method"],
                               run.launch["world"].get("bind_addr") or world["bind_addr"])
            self.store = TCPStore(bind, 0, is_master=True, wait_for_workers=False,
                                  timeout=world["rendezvous_timeout"])

        def spec(w):
            replica, k = grid.place(w)
            return (PipelineSetup(
                model=run.model_slice(run.stages_of(k)), worker=w, stage=k, stages=stages,
                num_stages=stages * run.virtual,
                pipeline=[self.workers[grid.index(replica, r)] for r in range(stages)],
                replica=replica, replicas=grid.replicas,
                store=(self.store.host, self.store.port) if self.store else None,
                schedule=config["pipeline"]["schedule"], optimizer=p.optimizer,
                optimizer_kwargs=p.optimizer_kwargs, loss=config["model"]["loss"],
                hooks=[tuple(h) for h in p.hooks], offload=config["offload"] or {},
                heartbeat_timeout=world["heartbeat_timeout"],
                rendezvous_timeout=world["rendezvous_timeout"],
                simulated_link=world.get("simulated_link"), timeout=run.timeout,
                trace=run.trace.enabled, resume_from=run.resume_from),)
        return self.calls.gather(self.calls.to_all(_stage.setup, spec), run.start - 1)

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
                                targets=ys if k == self.run.last_rank else None))
        return out

    def _combine(self, results):
        """The last stages' results (:class:`~distgrad.launch.contracts.StepResult`) of
        every replica, as the whole batch's metrics."""
        last = [results[self.grid.index(r, self.run.last_rank)]
                for r in range(self.grid.replicas)]
        # equal shards: the mean of the replicas' means (one replica: its loss, bit for bit)
        out = {"loss": sum(r.loss for r in last) / len(last),
               "correct": sum(r.correct for r in last),
               "count": sum(r.count for r in last)}
        for r in results[:self.grid.stages]:  # replica 0's hook values (all replicas agree)
            out.update(r.reported)
        return out

    def steps_per_command(self):
        return self.run.command_size.steps()

    def issue_steps(self, first, count):
        """Send steps ``first .. first + count - 1`` to every stage, as one command each."""
        run = self.run
        work = [self._shard_work(s, run.batches.shards(s), run.micro)
                for s in range(first, first + count)]
        seq = self.calls.next_seq()
        futures = []
        for k, w in enumerate(self.workers):
            run.trace.message("send", "input", _trace.flow_id("input", first, 0, k))
            steps = [work[s - first][k] for s in range(first, first + count)]
            futures.append(rpc.rpc_async(w, _stage.step, (seq, steps), timeout=run.timeout))
        return futures

    def complete_steps(self, first, count, futures):
        """Wait for a command of ``count`` steps from ``first``; returns ``(the whole
        batch's result, when it finished)`` of each."""
        try:
            results = self.calls.gather(futures, first)
        except StageFailure as failure:
            culprit = self.workers.index(failure.record["worker"])
            at = self.run.failed_steps.take(culprit, FAILURE_NOTICE)
            if at is not None:  # else: it died, in the first step that did not complete
                failure.record["step"] = at + 1
            raise
        now = time.perf_counter()
        for k, r in enumerate(results):
            if not (isinstance(r, list) and len(r) == count
                    and all(isinstance(x, StepResult) for x in r)):
                raise self.calls.diagnose(k, ContractError(
                    f"a command of {count} steps was answered with {type(r).__name__} "
                    f"{str(r)[:80]}, not {count} StepResult"), first)
            self.run.trace.message("receive", "result", _trace.flow_id("result", first, 0, k))
        # a step is done once every stage finished it
        return [(self._combine([r[i] for r in results]),
                 now - min(r[i].seconds_ago for r in results)) for i in range(count)]

    # -- evaluation, checkpoints, the end --
    def evaluate_part(self, key, part, step_count):
        """The :class:`~distgrad.launch.contracts.StepResult` of every replica on its
        share of ``part``."""
        replicas = self.grid.replicas
        work = self._shard_work(  # each replica evaluates a share of the chunk
            key, [(part[0][r::replicas], part[1][r::replicas]) for r in range(replicas)],
            self.run.micro)
        seq = self.calls.next_seq()
        results = self.calls.gather(self.calls.to_all(
            _stage.evaluate, lambda k: (seq, work[k])), step_count - 1)
        return [results[self.grid.index(r, self.run.last_rank)] for r in range(replicas)]

    def save(self, directory, step_count):
        """Every stage's state written to ``directory``: the futures of the writes."""
        seq = self.calls.next_seq()
        return self.calls.to_all(_stage.save, lambda k: (seq, directory, step_count))

    def finish(self):
        """Every stage lets go of what it holds (the replicas' process group, offloaded
        activations); returns their trace events."""
        seq = self.calls.next_seq()
        return self.calls.gather(self.calls.to_all(_stage.finish, lambda k: (seq,)),
                                 self.run.last_step)

    def close(self):
        if self.store is not None:
            self.store.close()

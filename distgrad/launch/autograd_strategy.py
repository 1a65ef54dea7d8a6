"""``world.strategy = "autograd"``: the coordinator trains through distributed autograd.

The shape of the pytorch/examples RPC pipeline (``distributed/rpc/pipeline``): each
stage is a :class:`~distgrad.launch.remote_stage.RemoteStage` held by an RRef on its
worker; in one distributed autograd context per step the coordinator sends every
micro-batch through the stages at once, as RPC futures (``stage_rref.rpc_async()
.forward(...)``): stage ``k`` pushes its output straight to stage ``k + 1`` (an RPC
inside the context, so the gradient goes straight back) as soon as it is computed,
before its next forward starts, and the last stage's output comes back as the
future's value; so the stages work on different micro-batches at once. (Stage
``k + 1`` fetching an RRef of stage ``k``'s output, as pytorch/examples does, cost a
fetch whose reply competed with stage ``k``'s next forward: 2-10 ms per micro-batch
on 2 cores, where a push costs 0.5 ms.)
The coordinator computes each micro-batch's loss on the last stage's output and runs one
``dist_autograd.backward`` over all of them. The parameters are those of a
``DistributedOptimizer``, and each stage steps its own part of it as soon as its
part of the backward is done (``RemoteStage.finish_step``: after computing its
deferred weight gradients), so a stage steps while the stages before it still run
their backward, and ``backward`` returns with the whole step done: no message goes
to the stages between the backward and the next step's forward. Steps are in flight
(``run.in_flight`` of them, as the pipeline strategy's commands): a step's first
micro-batch is sent, in a distributed autograd context of the step's own
(``HeldContext``), before the step before it has run its backward, so the first stage
starts the next forward as soon as it has stepped (it waits for its optimizer step
there: the forward sees the stepped parameters) instead of after a message to the
coordinator and one back; the step's other micro-batches follow once the step before
is complete. The forwards are numbered in step order, so the stages run them in that
order and every run does the same arithmetic. With ``[[hooks]]`` (their values are a
step's) a step is complete before the next is sent; before a checkpoint, the steps
sent are completed first. With
``model.aux_weight`` an auxiliary loss (the weighted mean square of the outputs)
takes a second backward over the same forward (``retain_graph=True`` in the first);
the forwards tell the stages that a step has two passes, and they step after the
second.

Everything else is the coordinator's (:mod:`distgrad.launch.coordinator`), as for the
pipeline strategy: batches, metrics, evaluation, checkpoints (the same stage files: each
worker writes its module and its local optimizer's state), resume, traces and failure
reports.
``[[hooks]]`` of kind ``forward``, ``full_backward`` and ``tensor_grad`` are
registered on the stages' modules and parameters and run here, in the coordinator
(:mod:`distgrad.launch.coordinator_hooks`).
"""
import time

import distgrad
import distgrad.distributed.autograd as dist_autograd
from distgrad.distributed import rpc
from distgrad.distributed.optim import DistributedOptimizer

from . import trace as _trace
from .contracts import RemoteSetup, StepResult
from .coordinator_hooks import CoordinatorHooks
from .data import micro_batches
from .remote_stage import RemoteStage
from .losses import LOSSES, add_micro_batch_loss, auxiliary_loss
from .stage_calls import StageFailure

__all__ = ["AutogradStrategy"]

_WATCH_SLICE = 0.1  # how often a coordinator waiting for outputs looks for failed stages


def _first_failure(pushed):
    """(stage, error) of the first of ``pushed`` ((stage, future) pairs) that failed."""
    return next(((k, f.exception()) for k, f in pushed
                 if f.done() and f.exception() is not None), None)


class AutogradStrategy:
    """Training through remote stages, driven by the coordinator ``run`` (see the module
    docstring; the methods a strategy offers are listed in
    :mod:`distgrad.launch.pipeline_strategy`)."""

    def __init__(self, run):
        self.run, self.calls, self.workers = run, run.calls, run.workers
        self.timeout, self.trace = run.timeout, run.trace
        self.stages = []       # RRefs of the RemoteStages, stage order
        self.turns = [0] * len(self.workers)  # forwards numbered per stage (their order)
        self.optimizer = None
        model = run.config["model"]
        self.loss_fn = LOSSES[model["loss"]]()
        self.classify = model["loss"] == "cross_entropy"
        self.aux_weight = model["aux_weight"]
        self.hooks = CoordinatorHooks(run.plan)
        self.passes = 2 if self.aux_weight > 0 else 1  # backward passes per step
        self._sent = []        # _StepSent of the steps sent and not completed, in order

    # -- setup --
    def setup(self):
        """Every worker's RemoteStage made, connected to the next; their sizes."""
        run, gather = self.run, self.calls.gather
        p, before = run.plan, run.start - 1
        self.stages = [
            rpc.remote(w, RemoteStage, args=(RemoteSetup(
                model=run.model_slice([k]), stage=k, stages=len(self.workers),
                timeout=self.timeout, trace=self.trace.enabled,
                resume_from=run.resume_from),), timeout=self.timeout)
            for k, w in enumerate(self.workers)]
        info = gather([s.rpc_async(timeout=self.timeout).describe() for s in self.stages],
                      before)
        gather([s.rpc_async(timeout=self.timeout).connect(n)
                for s, n in zip(self.stages, self.stages[1:])], before)
        try:
            params = [r for i in info for r in i.named_parameters.values()]
            self.optimizer = DistributedOptimizer(p.optimizer, params, **p.optimizer_kwargs)
            self.hooks.register(info)
        except Exception as e:  # noqa: BLE001 - a failure here names its worker
            raise self._failure(e, before) from None
        if run.resume_from:
            gather([s.rpc_async(timeout=self.timeout).load_optimizer(self.optimizer.id)
                    for s in self.stages], before)
        return info

    # -- steps --
    def _failure(self, error, step):
        """A StageFailure naming the worker an error came from (by its message when it
        names one; a dead worker is found by the probe of _diagnose)."""
        if isinstance(error, StageFailure):
            return error
        text = str(error)
        culprit = next((k for k, w in enumerate(self.workers) if f"'{w}'" in text
                        or f"{w} " in text or text.startswith(w)), 0)
        return self.calls.diagnose(culprit, error, step)

    def _number(self, n):
        """The turns of the next ``n`` forwards on each stage, numbered in the order the
        steps are issued: each stage runs them in that order, whenever they arrive."""
        turns = []
        for k in range(len(self.stages)):
            turns.append(range(self.turns[k] + 1, self.turns[k] + 1 + n))
            self.turns[k] += n
        return turns

    def _send_forwards(self, key, xs, train, turns, first=0, pushed=None, results=None):
        """Send micro-batches ``xs`` (numbered from ``first``) through the stages, all at
        once: the first stage gets the inputs, each stage pushes its outputs to the next
        (activations and gradients go stage to stage, not through this process). Returns
        the futures of the stages that push and those of the last stage's outputs
        (``(stage, future)`` pairs, added to ``pushed`` and ``results`` if given)."""
        count = len(self.stages)
        pushed = [] if pushed is None else pushed
        results = [] if results is None else results
        # in training, each stage learns when to step its optimizer (RemoteStage.forward)
        finish = [self.passes, self.optimizer.id] if train else None
        for mb, x in enumerate(xs, first):
            self.trace.message("send", "input", _trace.flow_id("input", key, mb, 0))
            for k, stage in enumerate(self.stages):
                value = distgrad.from_numpy(x) if k == 0 else None  # None: pushed to it
                fut = stage.rpc_async(timeout=self.timeout).forward(
                    turns[k][mb], key, mb, value, train, finish)
                (results if k + 1 == count else pushed).append((k, fut))
        return pushed, results

    def _outputs(self, key, pushed, results):
        """The last stage's outputs of :meth:`_send_forwards`' micro-batches, once every
        stage's forward is done."""
        count, outputs = len(self.stages), []
        for mb, (_, fut) in enumerate(results):
            outputs.append(self._wait_output(fut, pushed, key, mb))
            self.trace.message("receive", "result",
                               _trace.flow_id("result", key, mb, count - 1))
            self.trace.on_gradient(outputs[-1], ("send", "grad",
                                                 _trace.grad_flow_id(key, mb, count - 1)))
        for k, fut in pushed:  # done: the last stage used what they pushed
            try:
                fut.wait(self.timeout + 10.0 if self.timeout else None)
            except Exception as e:  # noqa: BLE001 - the run fails, naming the stage
                raise self.calls.diagnose(k, e, key) from None
        return outputs

    def _wait_output(self, fut, pushed, key, mb):
        """The last stage's output ``fut``. Meanwhile, a failure of an earlier stage's
        forward fails the step at once: the last stage would wait for that stage's push
        until its timeout (and a stage that died fails only the calls made to it)."""
        deadline = time.monotonic() + self.timeout + 10.0 if self.timeout else None
        while not fut.wait_done(_WATCH_SLICE):
            failed = _first_failure(pushed)
            if failed is not None:
                raise self.calls.diagnose(*failed, key)
            if deadline is not None and time.monotonic() > deadline:
                last = len(self.stages) - 1
                raise self.calls.diagnose(last, TimeoutError(
                    f"stage {last} gave no output for micro-batch {mb} within "
                    f"{self.timeout + 10.0:.0f} s"), key)
        try:
            return fut.value()
        except Exception as e:  # noqa: BLE001 - the run fails, naming the stage
            # the first stage whose forward failed is at fault; else the last
            k, error = _first_failure(pushed) or (len(self.stages) - 1, e)
            raise self.calls.diagnose(k, error, key) from None

    def _send_step(self, step):
        """Step ``step``'s first micro-batch sent, in a context of its own: a
        :class:`_StepSent`. That one is what the first stage starts with once the step
        before has stepped it; the others follow when this one is completed (sent ahead,
        they would only wait there, and their sending competes with the stages' compute)."""
        x, y = self.run.batches.batch(step)
        n = min(self.run.micro, len(x))
        xs = micro_batches(x, n)
        sent = _StepSent(step, xs, micro_batches(y, n), self._number(n),
                         dist_autograd.HeldContext())
        try:
            with sent.context.entered():
                sent.pushed, sent.results = self._send_forwards(step, xs[:1], True,
                                                                sent.turns)
        except BaseException:
            sent.context.release()
            raise
        return sent

    def _finish_step(self, sent):
        """Complete a step sent by :meth:`_send_step`: its outputs, losses and backward
        (which returns once every stage stepped); then its context is released."""
        step, ys, cid = sent.step, sent.targets, sent.context.context_id
        total = sum(len(t) for t in ys)
        out = {"loss": 0.0, "correct": 0, "count": total}
        try:
            with self.trace.span("forward", step=step):
                with sent.context.entered():  # the rest of its micro-batches
                    self._send_forwards(step, sent.inputs[1:], True, sent.turns, 1,
                                        sent.pushed, sent.results)
                outputs = self._outputs(step, sent.pushed, sent.results)
                losses = [add_micro_batch_loss(out, self.loss_fn, z, ym, total, self.classify)
                          for z, ym in zip(outputs, ys)]
            try:  # the stages step their optimizers before the last backward returns
                with self.trace.span("backward", step=step):
                    dist_autograd.backward(cid, losses, retain_graph=self.passes > 1)
                    if self.passes > 1:
                        auxes = [auxiliary_loss(z, self.aux_weight, len(ym), total)
                                 for z, ym in zip(outputs, ys)]
                        out["aux_loss"] = sum(a.item() for a in auxes)
                        dist_autograd.backward(cid, auxes)
            except Exception as e:  # noqa: BLE001 - the run fails, naming the worker
                raise self._failure(e, step) from None
        finally:
            sent.context.release()
            self.trace.add_span("step", sent.started, self.trace.now(), lane="steps",
                                step=step)
        return out

    def steps_per_command(self):
        return 1  # the coordinator runs each step itself: nothing to save in messages

    def issue_steps(self, first, count):
        """Send steps ``first .. first + count - 1`` (their forwards); with hooks, whose
        values are a step's, each runs to completion here, one after the other."""
        steps = []
        for step in range(first, first + count):
            self.hooks.begin_step()  # (no hooks: nothing to begin or end)
            steps.append(self._send_step(step))
            self._sent.append(steps[-1])
            if self.hooks.entries:
                self._complete(steps[-1])
        return steps

    def _complete(self, sent):
        """Complete ``sent`` (once; its result or error is kept for complete_steps)."""
        if sent.outcome is None:
            try:
                out = self._finish_step(sent)
                out.update(self.hooks.end_step())
                sent.outcome = ((out, time.perf_counter()), None)
            except BaseException as e:  # noqa: BLE001 - raised by complete_steps, in order
                sent.outcome = (None, e)
            self._sent.remove(sent)
        return sent.outcome[1] is None

    def complete_steps(self, first, count, steps):
        """(result, when it finished) of each of ``steps``."""
        done = []
        for sent in steps:
            self._complete(sent)
            value, error = sent.outcome
            if error is not None:
                raise error
            done.append(value)
        return done

    # -- evaluation, checkpoints, the end --
    def evaluate_part(self, key, part, step_count):
        x, y = part
        n = min(self.run.micro, len(x))
        out = {"loss": 0.0, "correct": 0, "count": len(y)}
        self.hooks.begin_step()  # hooks fire on evaluation forwards too: not logged
        with distgrad.no_grad():
            xs = micro_batches(x, n)
            outputs = self._outputs(key, *self._send_forwards(key, xs, False,
                                                               self._number(len(xs))))
            for z, ym in zip(outputs, micro_batches(y, n)):
                add_micro_batch_loss(out, self.loss_fn, z, ym, len(y), self.classify)
        self.hooks.end_step()
        return [StepResult.of(out)]

    def save(self, directory, step_count):
        # after every step sent has stepped the stages (each completed: a list, not a
        # short-circuit); after a failed one, nothing is saved (complete_steps raises its
        # error first)
        if not all([self._complete(sent) for sent in list(self._sent)]):
            return []
        return [s.rpc_async(timeout=self.timeout).save(directory, step_count, self.optimizer.id)
                for s in self.stages]

    def finish(self):
        events = self.calls.gather([s.rpc_async(timeout=self.timeout).take_trace()
                                    for s in self.stages], self.run.last_step)
        self.hooks.remove()
        self.stages, self.optimizer = [], None
        return events

    def close(self):
        """Release the contexts of steps sent and never completed (a failed run's)."""
        for sent in self._sent:
            sent.context.release()
        self._sent = []


class _StepSent:
    """A training step whose forwards were sent: what completing it needs, and then its
    outcome (``(result, None)`` or ``(None, error)``)."""

    def __init__(self, step, inputs, targets, turns, context):
        self.step, self.inputs, self.targets = step, inputs, targets
        self.turns, self.context = turns, context
        self.started = _trace.Recorder.now()
        self.pushed = self.results = self.outcome = None

"""The worker side of ``world.strategy = "autograd"``: a stage held by an RRef.

The coordinator creates one :class:`RemoteStage` per worker with ``rpc.remote``
and drives it through RRef method calls (``stage_rref.rpc_async().forward(...)``,
the shape of the pytorch/examples RPC pipeline). Unlike the pipeline strategy's
stages (:mod:`distgrad.launch.stage`), a remote stage runs no backward pass of its
own: its forward runs inside the coordinator's distributed autograd context, and
it pushes its output to the next stage with an RPC made in that context
(``accept``), so RPC records every tensor that crosses processes and the
coordinator's ``dist_autograd.backward`` reaches this stage's graph; the parameters
are stepped with the gradients the context accumulated here.

Forwards run strictly in the order the coordinator numbered them, whatever order
the handler threads pick them up in: a leaf's gradient contributions are summed in
forward order by the distributed engine, so the same order every run gives the
same sums, bit for bit, as the one-process run.

A stage steps its own optimizer: a training forward tells it how many backward
passes the step runs (``finish``), and when its part of the last one is complete
(:class:`StepFinisher`, an ``on_backward_end`` extension of the step's context) it
computes its deferred weight gradients and applies the context's gradients with its
local part of the coordinator's ``DistributedOptimizer`` (``step_local``), before it
reports that part complete. So a stage whose backward is done steps while the stages
before it still run theirs, the coordinator's ``dist_autograd.backward`` returns with
every stage stepped, and no message is spent on either (the same arithmetic as
``DistributedOptimizer.step``, so the same parameters bit for bit).
The coordinator sends a step's forwards before the step before it has ended (steps in
flight): a training forward of a new step waits for the last step's optimizer step here,
so it sees the stepped parameters.
"""
import threading
import time

import distgrad
from distgrad.distributed.autograd import container as _contexts
from distgrad.distributed.optim import local_optimizer, step_local
from distgrad.distributed.rpc import RRef

from .checkpoint import atomic_save, stage_path
from .resolve import deferred_weights
from .contracts import RemoteSetup, RemoteStageInfo, expect
from .stage import CommandOrder, Inbox, build_modules, load_stage_state, stage_state
from .trace import Recorder, flow_id, grad_flow_id

__all__ = ["RemoteStage"]

_WATCH_SLICE = 0.05  # how often a forward waiting for the last step looks for its failure


class RemoteStage:
    """One stage's slice of the model on its worker (``spec``: the coordinator's
    :class:`~distgrad.launch.contracts.RemoteSetup`)."""

    def __init__(self, spec):
        expect(spec, RemoteSetup, "RemoteStage(spec): spec")
        self.index, self.last = spec.stage, spec.stage + 1 == spec.stages
        [(self.layers, self.module)] = build_modules(spec.model).values()
        self.order = CommandOrder(f"stage {self.index}", spec.timeout or None)
        self.trace = Recorder(spec.trace)
        self.resume_from = spec.resume_from
        if self.resume_from:
            load_stage_state(self.resume_from, self.index, self.layers, self.module)
        # Linear weights' gradients wait for finish_backward (pipeline.defer_weight_grads):
        # the backward reaches the stage before sooner, and one product per weight over
        # all micro-batches runs at the BLAS's full-batch speed.
        self.deferred = deferred_weights(self.module, spec.model.deferred_weights)
        if self.deferred is not None:
            self.deferred.activate()
        self.finisher = None  # the StepFinisher of the last training step's context
        self.timeout = spec.timeout  # of RPCs (0: none); of waits, None for none
        self.next = None      # RRef of the next stage (connect), None on the last
        self.inbox = Inbox()  # activations the previous stage pushed here (accept)

    def describe(self):
        """Its size and process, and RRefs to its module and parameters (by name)."""
        return RemoteStageInfo(
            parameters=sum(p.numel() for p in self.module.parameters()),
            module=RRef(self.module),
            named_parameters={n: RRef(p) for n, p in self.module.named_parameters()})

    def connect(self, next_stage):
        """Where this stage's outputs go: the next stage (an RRef to its RemoteStage)."""
        self.next = next_stage
        return True

    def accept(self, key, mb, x):
        """The previous stage's output for micro-batch ``mb`` of step ``key`` (its
        forward pushes it here: inside the step's context, so RPC records it)."""
        self.inbox.put((key, mb, "act"), x)
        return True

    def forward(self, turn, key, mb, x, train, finish=None):
        """Forward pass ``turn`` of this stage (micro-batch ``mb`` of step ``key``) of
        ``x``, or (``x`` None) of the output the previous stage pushed here. The last
        stage returns its output; the others push it to the next stage and return
        once it is there (a Future). ``finish``, in training: ``[backward passes of the
        step, id of the DistributedOptimizer]`` (see the module docstring)."""
        if x is None:
            x = self.inbox.take((key, mb, "act"), self.timeout or None,
                               f"stage {self.index - 1}")
            self.trace.message("receive", "act", flow_id("act", key, mb, self.index))
        else:
            self.trace.message("receive", "input", flow_id("input", key, mb, self.index))
        with self.order.turn(turn):
            if train and finish is not None:
                self._previous_step_done()
            with distgrad.set_grad_enabled(train), \
                    self.trace.span("forward", step=key, micro_batch=mb):
                y = self.module(x)
            if train and finish is not None and y.requires_grad:
                self._finish_after(key, *finish)
            if not self.last:  # pushed before the next forward starts: it leaves at once
                self.trace.message("send", "act", flow_id("act", key, mb, self.index + 1))
                pushed = self.next.rpc_async(timeout=self.timeout).accept(key, mb, y)
        if self.last:
            self.trace.message("send", "result", flow_id("result", key, mb, self.index))
        if train:  # the backward's messages: its input's gradient leaves, its output's comes
            if self.index:
                self.trace.on_gradient(x, ("send", "grad", grad_flow_id(key, mb, self.index - 1)))
            self.trace.on_gradient(y, ("receive", "grad", grad_flow_id(key, mb, self.index)))
        return y if self.last else pushed

    def _previous_step_done(self):
        """A training forward of a new step runs after the step before it stepped this
        stage's optimizer: the coordinator sends a step's forwards while the step before
        it is still in its backward, so the first one may wait here."""
        finisher = self.finisher
        if finisher is not None and finisher.context_id != _contexts.current_context_id():
            finisher.wait_done(self.timeout or None)

    def _finish_after(self, key, passes, optimizer_id):
        """The first training forward of a step's context: its optimizer step will follow
        the stage's part of the step's last backward pass. (A stage whose output needs no
        gradient takes part in no pass, and has no gradient to apply.)"""
        context_id = _contexts.current_context_id()
        if self.finisher is not None and self.finisher.context_id == context_id:
            return
        # (the last step's optimizer step ran: _previous_step_done waited for it)
        self.finisher = StepFinisher(self, key, context_id, passes, optimizer_id)
        _contexts.add_extension(context_id, self.finisher)

    def finish_step(self, key, context_id, optimizer_id):
        """Accumulate the weight gradients the step's backward passes left for later into
        the step's distributed autograd context, then apply its gradients here."""
        if self.deferred is not None:
            with self.trace.span("weight gradients", step=key):
                self.deferred.flush()
        with self.trace.span("optimizer step", step=key):
            step_local(optimizer_id, context_id)

    def load_optimizer(self, optimizer_id):
        """Resume: the local optimizer of ``DistributedOptimizer`` ``optimizer_id`` takes
        its state from the checkpoint this stage was built from."""
        if self.resume_from:
            state = distgrad.load(stage_path(self.resume_from, self.index))
            local_optimizer(optimizer_id).load_state_dict(state["optimizer"])
        return True

    def save(self, directory, step_count, optimizer_id):
        """Write this stage's checkpoint file, the same as a pipeline stage's."""
        with self.trace.span("checkpoint", lane="steps", step=step_count):
            atomic_save(stage_state(self.index, self.layers, step_count, self.module,
                                    local_optimizer(optimizer_id)),
                        stage_path(directory, self.index))
        return True

    def take_trace(self):
        """The stage's trace events, at the end of the run (deferral ends too)."""
        if self.finisher is not None:
            self.finisher.check_done()
        if self.deferred is not None:
            self.deferred.deactivate()
            self.deferred.discard()
        return self.trace.take()


class StepFinisher:
    """The end of a training step on a stage: after the stage's part of the step's last
    backward pass (``on_backward_end``, run by the distributed engine before the part
    reports its completion: an error here fails the backward, naming this worker)."""

    def __init__(self, stage, key, context_id, passes, optimizer_id):
        self.stage, self.key, self.context_id = stage, key, context_id
        self.passes, self.optimizer_id = passes, optimizer_id
        self.ended = 0
        self._lock = threading.Lock()
        self._stepped = threading.Event()

    def on_backward_end(self):
        with self._lock:
            self.ended += 1
            ended = self.ended
        if ended > self.passes:
            raise RuntimeError(f"stage {self.stage.index}: backward pass {ended} of step "
                               f"{self.key + 1}, whose forward announced {self.passes}; its "
                               "optimizer step already ran")
        if ended == self.passes:
            self.stage.finish_step(self.key, self.context_id, self.optimizer_id)
            self._stepped.set()

    def wait_done(self, timeout):
        """Wait until the step's optimizer step ran, then as :meth:`check_done`. A step
        whose context is gone without it (its backward failed, and the coordinator let
        go of the step) fails the wait at once; ``timeout`` bounds it otherwise."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self._stepped.wait(_WATCH_SLICE):
            if _contexts.get_context(self.context_id) is None:
                break
            if deadline is not None and time.monotonic() > deadline:
                break
        self.check_done()

    def check_done(self):
        """Raise unless the step's optimizer step ran (called when the next step starts)."""
        if self.ended < self.passes:
            raise RuntimeError(f"stage {self.stage.index}: step {self.key + 1} ended after "
                               f"its part of {self.ended} of the {self.passes} backward passes "
                               "its forward announced, so its optimizer did not step")
        if not self._stepped.is_set():
            raise RuntimeError(f"stage {self.stage.index}: the optimizer step of step "
                               f"{self.key + 1} failed or has not ended")

"""The worker side of a launch: one pipeline stage per worker process.

The coordinator calls these functions over RPC (they must be on the worker's
allowlist: the launcher starts workers with ``--allow distgrad.launch.stage``).
Each stage owns a slice of the model's layers and a local optimizer. Activations
go straight from one stage to the next and gradients straight back, as
one-way ``deliver`` calls; the coordinator only sends the steps' inputs (to the first
stage) and targets (to the last), a run of steps per command (``progress.py``), and
collects the losses.

Commands carry a sequence number and run strictly in that order, whatever order
the RPC handler threads pick them up in, so the coordinator can send the next step
before the current one has finished, and every run of the same config does the
same arithmetic in the same order (checkpoint resumes are bit-exact). A command
runs on the handler thread that received it: the handler pool grows while others
wait, so a neighbour's ``deliver`` is served meanwhile, and the stage's own calls
are nested calls of a handler, which RPC accepts even once the worker's main
thread has entered ``shutdown()`` (as ``distgrad worker`` does at once).

With data-parallel replicas (``world.replicas``) every stage exists once per
replica; the replicas of a stage average their gradients before each optimizer
step (:mod:`distgrad.launch.replicas`) and only replica 0 writes checkpoints.
"""
import os
import threading
import time
from contextlib import contextmanager, nullcontext

import distgrad
from distgrad.distributed import rpc
from distgrad.rpc import current_agent

from . import progress
from .activations import checkpointed
from .checkpoint import atomic_save, stage_path
from .resolve import deferred_weights
from .losses import LOSSES, add_micro_batch_loss
from .schedule import SCHEDULES, forward_only, one_f_one_b
from .trace import Recorder, flow_id

__all__ = ["setup", "step", "evaluate", "save", "clock", "finish", "deliver", "LOSSES"]

_stage = None  # this worker's Stage, made by setup()


def build_module(spec):
    """``(layers, module)``: this stage's slice of the model ``spec`` describes. Every
    stage builds the whole model from the same seed, so the parameters equal those of
    the model built in one process."""
    distgrad.manual_seed(spec["seed"])
    full = spec["factory"](**spec["factory_kwargs"])
    begin, end = spec["layers"]
    return (begin, end), checkpointed(full[begin:end], spec.get("checkpoint_activations", "none"))


def stage_state(index, layers, step, module, optimizer):
    """What a stage's checkpoint file holds (the same for every strategy). ``param_names``
    names the optimizer's parameters by position (it is built on ``module.parameters()``),
    so the state can be read by name (``distgrad.launch.dcp_reader``)."""
    return {"stage": index, "layers": list(layers), "step": step,
            "model": module.state_dict(), "optimizer": optimizer.state_dict(),
            "param_names": [name for name, _ in module.named_parameters()],
            "rng": distgrad.get_rng_state()}


def load_stage_state(directory, index, layers, module):
    """Load stage ``index``'s checkpoint from ``directory`` into ``module`` and this
    process's RNG; returns the state (its optimizer state is the caller's to load)."""
    state = distgrad.load(stage_path(directory, index))
    if list(state["layers"]) != list(layers):
        raise RuntimeError(f"checkpoint {directory} holds layers {state['layers']} for "
                           f"stage {index}, but this run gives it {list(layers)}")
    module.load_state_dict(state["model"])
    distgrad.set_rng_state(state["rng"])
    return state


class CommandOrder:
    """Runs commands strictly in the order of their sequence numbers (1, 2, ...),
    whatever order the RPC handler threads pick them up in."""

    def __init__(self, name, timeout):
        self.name, self.timeout = name, timeout
        self._cond = threading.Condition()
        self._next_seq = 1

    @contextmanager
    def turn(self, seq):
        """Run the body as command ``seq``, after every command before it."""
        with self._cond:
            if not self._cond.wait_for(lambda: self._next_seq >= seq, self.timeout):
                raise TimeoutError(f"{self.name}: command {seq} waited more than "
                                   f"{self.timeout} s for command {self._next_seq}")
            if self._next_seq != seq:
                raise RuntimeError(f"{self.name}: command {seq} arrived twice")
        try:
            yield
        finally:
            with self._cond:
                self._next_seq = seq + 1
                self._cond.notify_all()



class Inbox:
    """Tensors sent by the neighbouring stages, taken by key in schedule order."""

    def __init__(self):
        self._items = {}
        self._cond = threading.Condition()
        self._closed = None

    def put(self, key, value):
        with self._cond:
            self._items[key] = value
            self._cond.notify_all()

    def take(self, key, timeout, sender):
        with self._cond:
            self._cond.wait_for(lambda: key in self._items or self._closed, timeout)
            if key in self._items:
                return self._items.pop(key)
            if self._closed:
                raise RuntimeError(f"stage stopped while waiting for {key} from {sender}: "
                                   f"{self._closed}")
            raise TimeoutError(f"no {key[-1]} for micro-batch {key[1]} of step {key[0]} "
                               f"from {sender} within {timeout} s")

    def close(self, reason):
        with self._cond:
            self._closed = reason
            self._cond.notify_all()


class Stage:
    """A slice of the model, its optimizer and its place in the pipeline."""

    def __init__(self, spec):
        self.index, self.count = spec["stage"], spec["stages"]
        # this worker's index among all workers (= the stage index without replicas):
        # names its messages in traces
        self.worker, self.replica = spec["worker"], spec["replica"]
        self.prev, self.next = spec["prev"], spec["next"]
        self.first, self.last = self.index == 0, self.index == self.count - 1
        self.layers, self.module = build_module(spec)
        self.optimizer = spec["optimizer"](self.module.parameters(), **spec["optimizer_kwargs"])
        self.loss_fn = LOSSES[spec["loss"]]() if self.last else None
        self.classify = spec["loss"] == "cross_entropy"
        self.hooks = list(spec["hooks"])
        self.schedule = SCHEDULES[spec["schedule"]]
        # This stage's activation offloading (the config's [offload] table): its forward
        # passes save tensors under these hooks; backward reads them back (ahead).
        self.offload = None
        if spec["offload"]:
            from distgrad.offload import hooks_from_config
            self.offload = hooks_from_config(spec["offload"], f"[offload] of stage {self.index}",
                                             model=self.module)
        self.timeout = spec["timeout"] or None
        self.trace = Recorder(spec["trace"])
        if self.offload is not None and self.trace.enabled:
            self.offload.observe_io(self._trace_offload_io)
        self.inbox = Inbox()
        if spec["resume_from"]:
            self._load(spec["resume_from"])
        self.replicas = None
        if spec["replicas"] > 1:
            from .replicas import Replicas
            self.replicas = Replicas(spec, self.module)
            if self.replicas.ddp is not None:  # DDP averages in the backward after a forward
                self.schedule = one_f_one_b    # one stage: F0 B0 F1 B1 ...
        self.order = CommandOrder(f"stage {self.index}", self.timeout)
        # linear weights' gradients once per step, after the micro-batches' backward
        # passes have sent the stage before what it waits for (pipeline.defer_weight_grads)
        self.deferred = deferred_weights(self.module, spec["deferred_weights"])

    def _trace_offload_io(self, kind, nbytes, start, end):
        # called from the tier's own threads (writes) and from backward (reads)
        self.trace.add_span(f"offload {kind}", start, end, lane="offload I/O", bytes=nbytes)

    def turn(self, seq):
        """Run the body as command ``seq``, after every command before it."""
        return self.order.turn(seq)

    # -- passes --
    def run(self, key, micro_batches, inputs, targets, train):
        """One step (``train``) or one evaluation batch; ``key`` names it in messages.

        ``inputs`` (first stage) and ``targets`` (last stage) are lists with one array
        per micro-batch. Returns the last stage's loss and accuracy counts, and what
        the hooks reported.
        """
        schedule = self.schedule if train else forward_only
        order = schedule(self.index, self.count, micro_batches)
        total = sum(len(t) for t in targets) if self.last else 0
        held = {}
        out = {"loss": 0.0, "correct": 0, "count": total}
        deferred = self.deferred if train else None
        with distgrad.set_grad_enabled(train), deferred or nullcontext():
            for kind, mb in order:
                if kind == "F":
                    held[mb] = self._forward(key, mb, micro_batches, inputs, targets, total,
                                             out)
                else:
                    self._backward(key, mb, held.pop(mb))
            if deferred is not None:
                with self.trace.span("weight gradients", step=key):
                    deferred.flush()
        if train and self.replicas is not None and self.replicas.ddp is None:
            with self.trace.span("average gradients", step=key):
                self.replicas.average_gradients()
        if train:
            for hook, kwargs in self.hooks:
                for name, value in (hook(self.module, **kwargs) or {}).items():
                    out[f"{name}.stage{self.index}"] = float(value)
            with self.trace.span("optimizer step", step=key):
                self.optimizer.step()
                self.optimizer.zero_grad()
        return out

    def _forward(self, key, mb, count, inputs, targets, total, out):
        model, sync = self.module, nullcontext()
        if self.replicas is not None and distgrad.is_grad_enabled():
            model, sync = self.replicas.forward_of(mb, count)
        if self.first:
            x = distgrad.from_numpy(inputs[mb])
        else:
            x = distgrad.from_numpy(self.inbox.take((key, mb, "act"), self.timeout, self.prev))
            x.requires_grad_(distgrad.is_grad_enabled())
        with self.trace.span("forward", step=key, micro_batch=mb), sync, \
                self.offload if self.offload is not None else nullcontext():
            y = model(x)
            if self.last:
                loss = add_micro_batch_loss(out, self.loss_fn, y, targets[mb], total,
                                            self.classify)
                return x, loss
        self._send(self.next, "act", key, mb, y.detach().numpy())
        return x, y

    def _backward(self, key, mb, held):
        x, y = held
        grad = None if self.last else \
            distgrad.from_numpy(self.inbox.take((key, mb, "grad"), self.timeout, self.next))
        with self.trace.span("backward", step=key, micro_batch=mb):
            y.backward(grad)  # the last stage holds the loss: no gradient to start from
        if not self.first:
            self._send(self.prev, "grad", key, mb, x.grad.numpy())

    def _send(self, to, kind, key, mb, array):
        """One-way (as distributed autograd ships gradients): ``deliver`` answers nothing,
        so no reply crosses back and wakes this process mid-computation. A neighbour that
        is gone is known here at once; one that dies later fails the stage waiting for
        it, naming it, and the coordinator's probe finds it."""
        self.trace.message("send", kind, flow_id(kind, key, mb, self.worker))
        if not current_agent().notify(to, deliver, ((key, mb, kind), array, self.worker)):
            raise RuntimeError(f"stage {self.index}: {to} is gone; the {kind} of micro-batch "
                               f"{mb} of step {key} cannot be sent")

    # -- checkpoints --
    def state(self, step):
        return stage_state(self.index, self.layers, step, self.module, self.optimizer)

    def _load(self, directory):
        state = load_stage_state(directory, self.index, self.layers, self.module)
        self.optimizer.load_state_dict(state["optimizer"])

    def close(self, reason):
        self.inbox.close(reason)
        if self.replicas is not None:
            self.replicas.close()
            self.replicas = None


def _require():
    if _stage is None:
        raise RuntimeError("this worker has no pipeline stage: the coordinator calls "
                           "distgrad.launch.stage.setup first")
    return _stage


# -- the commands the coordinator sends ----------------------------------------------

def setup(spec):
    """Build this worker's stage from ``spec`` (made by the coordinator); returns its size."""
    global _stage
    if _stage is not None:
        _stage.close("replaced by a new setup")
    _stage = Stage(spec)
    return {"parameters": sum(p.numel() for p in _stage.module.parameters()),
            "pid": os.getpid()}


def step(seq, steps):
    """Train on a run of consecutive batches: ``steps`` holds ``(step index, micro-batch
    count, inputs, targets)`` for each. Returns each step's result (the last stage's
    loss and accuracy counts, what the hooks reported) and how long before the return
    it finished. When a step raises, the coordinator is told which
    (:func:`distgrad.launch.progress.failed`) before the error is."""
    stage = _require()
    if not steps:
        raise ValueError("a step command with no steps")
    first = steps[0][0]  # the command's messages are named after its first step
    stage.trace.message("receive", "input", flow_id("input", first, 0, stage.worker))
    done = []
    with stage.turn(seq):
        for step_index, micro_batches, inputs, targets in steps:
            try:
                with stage.trace.span("step", lane="steps", step=step_index):
                    out = stage.run(step_index, micro_batches, inputs, targets, train=True)
            except BaseException:
                _tell_failed(stage, step_index)
                raise
            done.append((out, time.perf_counter()))
    stage.trace.message("send", "result", flow_id("result", first, 0, stage.worker))
    return progress.timed(done)


def _tell_failed(stage, step_index):
    """Tell the coordinator (rank 0) which step of a command raised, before the error."""
    try:
        current_agent().notify(0, progress.failed, (stage.worker, step_index))
    except Exception:  # noqa: BLE001 - shutting down: the error itself says enough
        pass


def evaluate(seq, key, micro_batches, inputs, targets):
    """Forward passes only, on held-out data; returns loss and accuracy counts."""
    stage = _require()
    with stage.turn(seq), stage.trace.span("evaluate", lane="steps"):
        return stage.run(key, micro_batches, inputs, targets, train=False)


def save(seq, directory, step_count):
    """Write this stage's parameters, optimizer state and RNG state (atomically); of
    identical replicas, replica 0 alone writes."""
    stage = _require()
    with stage.turn(seq), stage.trace.span("checkpoint", lane="steps", step=step_count):
        if stage.replica == 0:
            atomic_save(stage.state(step_count), stage_path(directory, stage.index))
    return True


def finish(seq):
    """The stage's trace events; the stage is dropped afterwards."""
    global _stage
    stage = _require()
    with stage.turn(seq):
        events = stage.trace.take()
    stage.close("finished")
    if stage.offload is not None:
        stage.offload.close()  # its run directory (or store namespace) goes with it
    if _stage is stage:
        _stage = None
    return events


@rpc.functions.never_blocks  # served where it arrives: no hand-off to a handler thread
def deliver(key, array, sender):
    """A neighbour's activation or gradient for ``key = (step, micro-batch, kind)``."""
    stage = _require()
    step_key, mb, kind = key
    stage.trace.message("receive", kind, flow_id(kind, step_key, mb, sender))
    stage.inbox.put((step_key, mb, kind), array)


def clock():
    """This process's clock, for the coordinator's offset estimate."""
    return Recorder.now()

"""The worker side of a launch: its pipeline stages (one per worker, or
``pipeline.virtual_stages`` of them for interleaved and V schedules).

The coordinator calls these functions over RPC (they must be on the worker's
allowlist: the launcher starts workers with ``--allow distgrad.launch.stage``).
Each stage owns a slice of the model's layers and a local optimizer. The worker's
stages run ``distgrad.distributed.pipelining``'s schedule classes (``pipeline.schedule``,
see :mod:`.stage_parts`): activations go straight from one stage to the next and
gradients straight back, as one-way ``deliver`` calls; the coordinator only sends the
steps' inputs (to the first stage) and targets (to the last), a run of steps per command
(``progress.py``), and collects the losses.

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
import weakref
from contextlib import contextmanager, nullcontext

import distgrad
from distgrad import nn
from distgrad.autograd import defer_weight_grads
from distgrad.distributed import rpc
from distgrad.rpc import current_agent

from . import progress
from .activations import checkpointed
from .checkpoint import atomic_save, stage_path
from .contracts import PipelineSetup, StageInfo, StepResult, StepWork, expect
from .losses import LOSSES, add_micro_batch_loss
from .schedule import schedule_class
from .stage_parts import LaunchStage, RpcChannel, observer
from .trace import Recorder, flow_id

__all__ = ["setup", "step", "evaluate", "save", "clock", "finish", "deliver", "LOSSES"]

_stage = None  # this worker's Stage, made by setup()
_listening = weakref.WeakSet()  # the RPC agents that tell _peer_gone of peers gone


def build_modules(model):
    """``{stage index: (layers, module)}``: the slices of the model that ``model`` (a
    :class:`~distgrad.launch.contracts.ModelSlice`) describes, from one build. Every
    worker builds the whole model from the same seed, so the parameters equal those of
    the model built in one process."""
    distgrad.manual_seed(model.seed)
    full = model.factory(**model.factory_kwargs)
    return {k: ((begin, end), checkpointed(full[begin:end], model.checkpoint_activations))
            for k, begin, end in model.parts}


def stage_state(index, layers, step, module, optimizer):
    """What a stage's checkpoint file holds (the same for every strategy). ``param_names``
    names the optimizer's parameters by position (it is built on ``module.parameters()``),
    so the state can be read by name (``distgrad.launch.dcp_reader``)."""
    return {"stage": index, "layers": list(layers), "step": step,
            "model": module.state_dict(),
            "optimizer": optimizer.state_dict() if optimizer is not None else {},
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
    """Tensors sent by the neighbouring stages, taken by key in schedule order. A take
    from a neighbour that the RPC layer reports gone fails at once: the message it waits
    for may have been lost with the neighbour's host, and the coordinator, whose calls to
    that neighbour may all have been answered already, learns of the loss from this
    stage's error instead of its RPC timeout."""

    def __init__(self):
        self._items = {}
        self._cond = threading.Condition()
        self._closed = None
        self._gone = {}  # sender name -> why the RPC layer reported it gone

    def put(self, key, value):
        with self._cond:
            self._items[key] = value
            self._cond.notify_all()

    def take(self, key, timeout, sender):
        with self._cond:
            self._cond.wait_for(lambda: key in self._items or self._closed
                                or sender in self._gone, timeout)
            if key in self._items:  # it came before its sender went: still good
                return self._items.pop(key)
            if self._closed:
                raise RuntimeError(f"stage stopped while waiting for {key} from {sender}: "
                                   f"{self._closed}")
            if sender in self._gone:
                raise RuntimeError(f"{sender} is unreachable while this stage waits for its "
                                   f"message {key} (step, ...): {self._gone[sender]}")
            raise TimeoutError(f"no message {key} (step, ...) from {sender} within "
                               f"{timeout} s")

    def sender_gone(self, sender, why):
        """The RPC layer reported ``sender`` dead or gone (why: ``why``)."""
        with self._cond:
            self._gone[sender] = why
            self._cond.notify_all()

    def close(self, reason):
        with self._cond:
            self._closed = reason
            self._cond.notify_all()


class Stage:
    """This worker's slices of the model (one per stage it holds: ``pipeline.virtual_stages``
    of them), their optimizers, and the schedule that runs them with the other workers
    of its pipeline."""

    def __init__(self, spec):
        """``spec``: a :class:`~distgrad.launch.contracts.PipelineSetup`."""
        # this worker's index among all workers: names its messages in traces
        self.worker, self.replica = spec.worker, spec.replica
        self.index = spec.stage  # its place in its pipeline (= its rank there)
        self.count, self.num_stages = spec.stages, spec.num_stages
        self.timeout = spec.timeout or None
        self.trace = Recorder(spec.trace)
        self.inbox = Inbox()
        self.channel = RpcChannel(self.index, spec.pipeline, self.inbox, deliver, self.worker,
                                  self.timeout, self.trace)
        self.parts = build_modules(spec.model)  # {stage index: (layers, module)}
        self.optimizers = {k: spec.optimizer(m.parameters(), **spec.optimizer_kwargs)
                           for k, (_, m) in self.parts.items()  # (a ReLU alone has none)
                           if any(True for _ in m.parameters())}
        self.loss_fn = LOSSES[spec.loss]()
        self.classify = spec.loss == "cross_entropy"
        self.hooks = list(spec.hooks)
        self.schedule_name = spec.schedule
        modules = [m for _, m in self.parts.values()]
        module = modules[0] if len(modules) == 1 else nn.ModuleList(modules)
        # This worker's activation offloading (the config's [offload] table): its forward
        # passes save tensors under these hooks; backward reads them back (ahead).
        self.offload = None
        if spec.offload:
            from distgrad.offload import hooks_from_config
            self.offload = hooks_from_config(spec.offload, f"[offload] of stage {self.index}",
                                             model=module)
        if self.offload is not None and self.trace.enabled:
            self.offload.observe_io(self._trace_offload_io)
        if spec.resume_from:
            self._load(spec.resume_from)
        self.replicas = None
        if spec.replicas > 1:
            from .replicas import Replicas
            self.replicas = Replicas(spec, module)
            if self.replicas.ddp is not None:  # DDP averages in the backward after a forward
                self.schedule_name = "1f1b"    # one stage: F0 B0 F1 B1 ...
        self.order = CommandOrder(f"stage {self.index}", self.timeout)
        # linear weights' gradients once per step, after the micro-batches' backward
        # passes have sent the stage before what it waits for (pipeline.defer_weight_grads)
        names = set(spec.model.deferred_weights)
        weights = [w for m in modules for n, w in m.named_parameters() if n in names]
        self.deferred = defer_weight_grads(weights) if weights else None
        self.stages = {k: LaunchStage(self, m, k, self.num_stages, self.channel)
                       for k, (_, m) in self.parts.items()}
        self.schedules = {}   # (micro-batches, train) -> schedule
        self.out = None       # the step's loss and accuracy counts (the last stage's)

    def _trace_offload_io(self, kind, nbytes, start, end):
        # called from the tier's own threads (writes) and from backward (reads)
        self.trace.add_span(f"offload {kind}", start, end, lane="offload I/O", bytes=nbytes)

    def turn(self, seq):
        """Run the body as command ``seq``, after every command before it."""
        return self.order.turn(seq)

    @property
    def last(self):
        return self.num_stages - 1 in self.stages

    @property
    def first(self):
        return 0 in self.stages

    def _schedule(self, micro_batches, train):
        """The schedule of a step of ``micro_batches`` (training) or of an evaluation batch
        (forwards only, any number of micro-batches: Looped BFS's or ZB-V's placement)."""
        key = (micro_batches, train)
        if key not in self.schedules:
            name = self.schedule_name
            if not train:
                name = "gpipe" if name in ("gpipe", "1f1b") else \
                    "zbvzerobubble" if name in ("zbvzerobubble", "dualpipev") else "loopedbfs"
            stages = [self.stages[k] for k in sorted(self.stages)]
            made = schedule_class(name)(stages[0] if name in ("gpipe", "1f1b") else stages,
                                        micro_batches, loss_fn=self._loss, scale_grads=False)
            if self.trace.enabled:
                made._action_observer = observer(self.trace, lambda: self.channel.step)
            self.schedules[key] = made
        return self.schedules[key]

    def _loss(self, y, target):
        return add_micro_batch_loss(self.out, self.loss_fn, y, target, self.out["count"],
                                    self.classify)

    # -- passes --
    def run(self, work, train):
        """One step (``train``) or one evaluation batch: ``work`` is its
        :class:`~distgrad.launch.contracts.StepWork` (its ``step`` names it in messages).
        Returns the last stage's loss and accuracy counts and what the hooks reported
        (the makings of its :class:`~distgrad.launch.contracts.StepResult`)."""
        key, micro_batches = work.step, work.micro_batches
        inputs, targets = work.inputs or [], work.targets or []
        total = sum(len(t) for t in targets) if self.last else 0
        self.out = out = {"loss": 0.0, "correct": 0, "count": total}
        schedule = self._schedule(micro_batches, train)
        schedule._has_backward = train
        schedule._prepare_stages()
        self.channel.step = key
        args = [(distgrad.from_numpy(x),) for x in inputs] if self.first else None
        deferred = self.deferred if train else None
        with distgrad.set_grad_enabled(train), deferred or nullcontext():
            schedule._step_microbatches(args, None, targets if self.last else None,
                                        return_outputs=False)
            if deferred is not None:
                with self.trace.span("weight gradients", step=key):
                    deferred.flush()
        if train and self.replicas is not None and self.replicas.ddp is None:
            with self.trace.span("average gradients", step=key):
                self.replicas.average_gradients()
        reported = {}
        if train:
            for hook, kwargs in self.hooks:
                for k, (_, module) in self.parts.items():
                    for name, value in (hook(module, **kwargs) or {}).items():
                        reported[f"{name}.stage{k}"] = float(value)
            with self.trace.span("optimizer step", step=key):
                for optimizer in self.optimizers.values():
                    optimizer.step()
                    optimizer.zero_grad()
        return out, reported

    # -- checkpoints --
    def state(self, step):
        """Each stage's checkpoint contents, by stage index."""
        return {k: stage_state(k, layers, step, module, self.optimizers.get(k))
                for k, (layers, module) in self.parts.items()}

    def _load(self, directory):
        for k, (layers, module) in self.parts.items():
            state = load_stage_state(directory, k, layers, module)
            if k in self.optimizers:
                self.optimizers[k].load_state_dict(state["optimizer"])

    def close(self, reason):
        self.inbox.close(reason)
        if self.replicas is not None:
            self.replicas.close()
            self.replicas = None


def watch_neighbours():
    """Have this process's RPC agent tell the stage of the moment when a peer is gone
    (once per agent)."""
    agent = current_agent()
    if agent not in _listening:
        agent.add_peer_listener(_peer_gone)
        _listening.add(agent)


def _peer_gone(rank, why, left):
    """A peer died or left (on an RPC handler thread): a stage waiting for its message
    stops waiting."""
    stage = _stage
    if stage is not None:
        stage.inbox.sender_gone(current_agent().worker_info(rank).name, why)


def _require():
    if _stage is None:
        raise RuntimeError("this worker has no pipeline stage: the coordinator calls "
                           "distgrad.launch.stage.setup first")
    return _stage


# -- the commands the coordinator sends ----------------------------------------------

def setup(spec):
    """Build this worker's stage from ``spec``, a
    :class:`~distgrad.launch.contracts.PipelineSetup` made by the coordinator; returns
    its size."""
    global _stage
    expect(spec, PipelineSetup, "setup(spec): spec")
    if _stage is not None:
        _stage.close("replaced by a new setup")
    _stage = Stage(spec)
    watch_neighbours()
    return StageInfo(parameters=sum(p.numel() for _, m in _stage.parts.values()
                                    for p in m.parameters()), pid=os.getpid())


def step(seq, steps):
    """Train on a run of consecutive batches: ``steps`` holds a
    :class:`~distgrad.launch.contracts.StepWork` for each. Returns each step's
    :class:`~distgrad.launch.contracts.StepResult` (the last stage's loss and accuracy
    counts, what the hooks reported, how long before the return it finished). When a
    step raises, the coordinator is told which (:func:`distgrad.launch.progress.failed`)
    before the error is."""
    stage = _require()
    if not expect(steps, list[StepWork], "step(seq, steps): steps"):
        raise ValueError("a step command with no steps")
    first = steps[0].step  # the command's messages are named after its first step
    stage.trace.message("receive", "input", flow_id("input", first, 0, stage.worker))
    done = []
    with stage.turn(seq):
        for work in steps:
            try:
                with stage.trace.span("step", lane="steps", step=work.step):
                    out = stage.run(work, train=True)
            except BaseException:
                _tell_failed(stage, work.step)
                raise
            done.append((out, time.perf_counter()))
    stage.trace.message("send", "result", flow_id("result", first, 0, stage.worker))
    now = time.perf_counter()  # how long before the answer leaves each step finished
    return [StepResult.of(out, reported, now - when) for (out, reported), when in done]


def _tell_failed(stage, step_index):
    """Tell the coordinator (rank 0) which step of a command raised, before the error."""
    try:
        current_agent().notify(0, progress.failed, (stage.worker, step_index))
    except Exception:  # noqa: BLE001 - shutting down: the error itself says enough
        pass


def evaluate(seq, work):
    """Forward passes only, on held-out data (``work``: a
    :class:`~distgrad.launch.contracts.StepWork` whose ``step`` is negative); returns
    its :class:`~distgrad.launch.contracts.StepResult`."""
    stage = _require()
    expect(work, StepWork, "evaluate(seq, work): work")
    with stage.turn(seq), stage.trace.span("evaluate", lane="steps"):
        return StepResult.of(*stage.run(work, train=False))


def save(seq, directory, step_count):
    """Write this stage's parameters, optimizer state and RNG state (atomically); of
    identical replicas, replica 0 alone writes."""
    stage = _require()
    with stage.turn(seq), stage.trace.span("checkpoint", lane="steps", step=step_count):
        if stage.replica == 0:
            for k, state in stage.state(step_count).items():
                atomic_save(state, stage_path(directory, k))
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
def deliver(key, value, sender):
    """A neighbour's message ``value`` for ``key = (step, kind, stage, micro-batch)``: an
    activation for stage ``stage``, a gradient of its outputs, or the schedule's first
    handshake (see ``distgrad.distributed.pipelining``)."""
    stage = _require()
    step_key, kind, index, mb = key
    if kind != "hello":
        stage.trace.message("receive", kind, flow_id(kind, step_key, mb, index))
    stage.inbox.put(tuple(key), value)


def clock():
    """This process's clock, for the coordinator's offset estimate."""
    return Recorder.now()

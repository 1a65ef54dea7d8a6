"""What a launch worker's pipeline stages are made of: ``torch.distributed.pipelining``'s
stages and schedules (one implementation of the schedules in distgrad), with the launch's
own ways in.

* :class:`RpcChannel`: the messages between the workers of one pipeline, as one-way RPC
  calls (``deliver``) into each worker's inbox, named by step, so a command's steps
  never mix; a neighbour that is gone is known when a message to it cannot leave.
* :class:`LaunchStage`: a :class:`PipelineStage` whose forward passes run under the
  worker's activation offloading and, with data-parallel replicas of one stage, DDP's
  synchronisation (all but the step's last micro-batch under ``no_sync``); errors of the
  model reach the coordinator as they are (no wrapping), so its report names them.
* :func:`observer`: each compute action (F, B, I, W) as a span of the trace.
"""
from contextlib import contextmanager, nullcontext

import distgrad
from distgrad.distributed.pipelining import PipelineStage
from distgrad.distributed.pipelining.actions import B, F, I, W
from distgrad.rpc import current_agent

from .trace import flow_id

__all__ = ["RpcChannel", "LaunchStage", "observer"]

_SPANS = {F: "forward", B: "backward", I: "backward inputs", W: "backward weights"}


class RpcChannel:
    """Messages of the workers ``names`` (by pipeline rank) to and from rank ``rank``."""

    def __init__(self, rank, names, inbox, deliver, worker, timeout, trace):
        self.rank, self.size, self.names = rank, len(names), names
        self.inbox, self.deliver, self.worker = inbox, deliver, worker
        self.timeout, self.trace = timeout, trace
        self.step = None  # the step (or evaluation batch) the messages belong to

    def post(self, key, peer):
        return key  # messages wait in the inbox until taken

    def send(self, key, peer, value):
        kind, stage, mb = key
        if kind != "hello":
            self.trace.message("send", kind, flow_id(kind, self.step, mb, stage))
        if not current_agent().notify(self.names[peer], self.deliver,
                                      ((self.step, kind, stage, mb), value, self.worker)):
            raise RuntimeError(f"{self.names[self.rank]}: {self.names[peer]} is gone; the "
                               f"{kind} of stage {stage}, micro-batch {mb} of step "
                               f"{self.step} cannot be sent")

    def take(self, handle, key, peer):
        return self.inbox.take((self.step,) + key, self.timeout, self.names[peer])


class LaunchStage(PipelineStage):
    """Stage ``index`` of a launch, on ``owner`` (the worker's :class:`Stage`)."""

    def __init__(self, owner, module, index, num_stages, channel):
        super().__init__(module, index, num_stages, _channel=channel)
        self.owner = owner
        self.wrap_errors = False

    def _forward(self, args, kwargs, mb_index):
        owner, model, sync = self.owner, self.submod, nullcontext()
        replicas = owner.replicas
        if replicas is not None and replicas.ddp is not None and distgrad.is_grad_enabled():
            model, sync = replicas.forward_of(mb_index, self.chunks)
        with sync, owner.offload if owner.offload is not None else nullcontext():
            return model(*args, **kwargs)


def observer(trace, step_of):
    """The schedules' action observer: a trace span per compute action of step
    ``step_of()``."""
    @contextmanager
    def observe(rank, action):
        with trace.span(_SPANS.get(action.computation_type, str(action.computation_type)),
                        step=step_of(), micro_batch=action.microbatch_index,
                        stage=action.stage_index, action=str(action)):
            yield
    return observe

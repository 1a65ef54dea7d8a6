"""Pipeline parallelism with ``torch.distributed.pipelining``'s API.

A model is cut into stages (by hand, or :func:`pipeline` for an ``nn.Sequential``), each
rank builds a :class:`PipelineStage` for its part (or several), and a schedule runs the
micro-batches through them::

    stage = PipelineStage(part, rank, world_size)
    schedule = Schedule1F1B(stage, n_microbatches=4, loss_fn=nn.MSELoss())
    schedule.step(x) if rank == 0 else schedule.step(target=y, losses=losses)

Modules: :mod:`.stage` (the stage), :mod:`.schedules` (the schedule classes; their orders
in :mod:`.orders`, the IR in :mod:`.actions`, its lowering in :mod:`.lowering`, the
executor in :mod:`.runtime`), :mod:`.microbatch` (splitting and merging),
:mod:`._backward` (the split backward of zero-bubble schedules), :mod:`._IR`
(:func:`pipeline`), :mod:`.channel` (messages between ranks), :mod:`.handshake` (the
first step's checks between neighbours). See ``docs/pipelining.md``.
"""
from ._IR import Pipe, SplitPoint, pipe_split, pipeline
from .schedules import (Schedule1F1B, ScheduleDualPipeV, ScheduleGPipe,
                        ScheduleInterleaved1F1B, ScheduleInterleavedZeroBubble,
                        ScheduleLoopedBFS, ScheduleZBVZeroBubble, _ScheduleForwardOnly)
from .stage import PipelineStage, build_stage

__all__ = ["Pipe", "pipe_split", "SplitPoint", "pipeline", "PipelineStage", "build_stage",
           "Schedule1F1B", "ScheduleGPipe", "ScheduleInterleaved1F1B", "ScheduleLoopedBFS",
           "ScheduleInterleavedZeroBubble", "ScheduleZBVZeroBubble", "ScheduleDualPipeV"]

"""``distgrad.profiler``: PyTorch's ``torch.profiler``, for distgrad's ops and engine.

Ops record as PyTorch names them (``aten::mm``), backward nodes as
``autograd::engine::evaluate_function: MmBackward0`` around ``MmBackward0``, blocks as
``record_function`` names them. With RPC, what a profiled call runs on another worker
lands in the caller's profile too (events with that worker's ``node_id``, its own
process in the trace, arrows from each send to its serving), and so does every
worker's part of a distributed backward. See ``docs/profiling.md``.

>>> import distgrad
>>> from distgrad.profiler import profile, record_function
>>> x = distgrad.ones(2, 2, requires_grad=True)
>>> with profile() as prof:
...     with record_function("step"):
...         (x * x).sum().backward()
>>> [e.name for e in prof.events()][:3]
['step', 'aten::mul', 'aten::sum']
>>> prof.key_averages().table().splitlines()[1].split("  ")[-2].strip()
'# of Calls'
"""
from ..autograd.profiler import kineto_available, record_function
from ..autograd.profiler_util import DeviceType
from .profiler import (ExecutionTraceObserver, ProfilerAction, ProfilerActivity, _KinetoProfile,
                       profile, schedule, supported_activities, tensorboard_trace_handler)

__all__ = ["profile", "schedule", "supported_activities", "tensorboard_trace_handler",
           "ProfilerAction", "ProfilerActivity", "kineto_available", "DeviceType",
           "record_function", "ExecutionTraceObserver"]

"""``[[hooks]]`` that run in the coordinator, fired by the stages (``world.strategy = "autograd"``).

Each entry becomes a cross-process hook (:mod:`distgrad.distributed.autograd.hooks`)
registered from the coordinator: a module forward or full backward hook on a
stage's module, or a gradient hook on one parameter. The stage's worker calls back
into the coordinator, which runs the function with what PyTorch gives a hook (the
module as ``"<worker>:<name>"``, since modules do not travel). What the function
returns, a dict of numbers, is averaged over the step's calls and logged in
``metrics.jsonl`` as ``<key>.stage<N>``; the function never changes what the
stage computes (its return value is not handed back as a replacement)::

    [[hooks]]
    ref = "distgrad.launch.hooks:activation_stats"
    kind = "forward"

Every call is a round trip from the stage to the coordinator, made while the stage
computes: a hook costs time in proportion to its calls (micro-batches x stages).
"""
import math
import threading

import distgrad
from distgrad.distributed.autograd import hooks as dist_hooks

__all__ = ["CoordinatorHooks"]


class CoordinatorHooks:
    """The coordinator hooks of a plan: registration, the values of the current step."""

    def __init__(self, plan):
        self.entries = plan.coordinator_hooks
        self.handles = []
        self._values = {}
        self._lock = threading.Lock()

    def register(self, stages):
        """Register every entry; ``stages``: each stage's ``RemoteStage.describe()`` (a
        :class:`~distgrad.launch.contracts.RemoteStageInfo`)."""
        for entry in self.entries:
            for k in entry.stages:
                call = self._recorder(entry, k)
                if entry.kind == "tensor_grad":
                    rref = stages[k].named_parameters[entry.parameter]
                    self.handles.append(dist_hooks.register_tensor_hook(rref, call))
                else:
                    self.handles.append(dist_hooks.register_module_hook(
                        stages[k].module, entry.kind, call))

    def _recorder(self, entry, stage):
        def call(*args):
            with distgrad.no_grad():
                values = entry.fn(*args, **entry.kwargs) or {}
            with self._lock:
                for name, value in values.items():
                    self._values.setdefault(f"{name}.stage{stage}", []).append(float(value))
            return None  # an observer: what the stage computes stays as it is
        return call

    def begin_step(self):
        with self._lock:
            self._values = {}

    def end_step(self):
        """``{"<key>.stage<N>": mean over the step's calls}``."""
        with self._lock:
            values, self._values = self._values, {}
        return {k: math.fsum(v) / len(v) for k, v in values.items()}

    def remove(self):
        handles, self.handles = self.handles, []
        for h in handles:
            h.remove()

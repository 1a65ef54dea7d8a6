"""How many steps one command of the pipeline strategy carries, and what a stage that
fails in the middle of one tells the coordinator.

A step command carries a run of consecutive steps: one message per stage for several
steps, because on a small model a command costs more than a step's compute (the
quickstart's 2 stages spent as much CPU on the coordinator's two messages per step as
on the step itself, and each command woke the stage between two steps). The run ends
where anything else must happen in between (a checkpoint, an evaluation, the end) and
holds about :data:`COMMAND_SECONDS` of steps, so a large model still gets one step per
command, and at most :data:`MAX_COMMAND_BYTES` of inputs and targets (a light model on
heavy data does not send hundreds of batches ahead). Each stage returns the results of
the run's steps with how long before its answer each finished
(``StepResult.seconds_ago``: a difference on one clock), so the coordinator logs every
step with its own time.

A stage whose step raises first tells the coordinator which step it was, one-way
(:func:`failed`, served on the coordinator's I/O thread), then raises: the failure
report names that step, not the command's first. A process that dies cannot: its
failure names the first step not completed. Either way the metrics of the failed
command's steps are not logged (they are incomplete: the other stages never answered).
"""
import threading

from distgrad.distributed import rpc

__all__ = ["CommandSize", "COMMAND_SECONDS", "MAX_STEPS_PER_COMMAND", "MAX_COMMAND_BYTES",
           "FailedSteps", "failed"]

COMMAND_SECONDS = 0.02     # of steps per command, once the step time is known
MAX_STEPS_PER_COMMAND = 32
MAX_COMMAND_BYTES = 16 << 20  # of the steps' inputs and targets in one command

_failed_steps = None  # the coordinator's FailedSteps (it allows this module over RPC)


class CommandSize:
    """How many steps the next command may carry: about :data:`COMMAND_SECONDS` of them
    at the step time seen so far (one until a step time is known), with at most
    :data:`MAX_COMMAND_BYTES` of data when a step's is ``bytes_per_step``."""

    def __init__(self, bytes_per_step=0):
        self.seconds_per_step = None
        self.most = max(1, min(MAX_STEPS_PER_COMMAND,
                               MAX_COMMAND_BYTES // max(bytes_per_step, 1)))

    def observe(self, steps, seconds):
        """``steps`` steps completed one after the other within ``seconds``."""
        if steps > 0 and seconds > 0:
            self.seconds_per_step = seconds / steps

    def steps(self):
        if self.seconds_per_step is None:
            return 1
        return max(1, min(self.most, int(COMMAND_SECONDS / self.seconds_per_step)))


class FailedSteps:
    """The step at which each worker that raised in a step command failed."""

    def __init__(self, workers):
        self.workers = workers
        self._steps = {}
        self._cond = threading.Condition()

    def put(self, worker, step):
        if type(worker) is not int or not 0 <= worker < self.workers or type(step) is not int:
            raise ValueError(f"a malformed failure notice: step {step!r} of worker {worker!r}")
        with self._cond:
            self._steps[worker] = step
            self._cond.notify_all()

    def take(self, worker, timeout):
        """The step ``worker`` failed at, or None if it said none within ``timeout`` s."""
        with self._cond:
            self._cond.wait_for(lambda: worker in self._steps, timeout)
            return self._steps.pop(worker, None)


def install(failed_steps):
    """Make ``failed_steps`` the one :func:`failed` fills (on the coordinator)."""
    global _failed_steps
    _failed_steps = failed_steps


@rpc.functions.never_blocks  # served where it arrives: it only files the notice
def failed(worker, step):
    """Stage ``worker``'s step ``step`` (0-based) raised; its error follows."""
    if _failed_steps is None:
        raise RuntimeError("this process is not a launch's coordinator")
    _failed_steps.put(worker, step)

"""The coordinator's calls to its workers, and which worker is at fault when one fails.

Every strategy sends its commands to the workers over RPC and waits for their answers
(:meth:`StageCalls.gather`). When an answer is an error, a probe of every worker
(:meth:`StageCalls.diagnose`) tells a worker that died or stopped (it does not answer
within the heartbeat bound) from the stage whose call raised, and the failure is raised
as a :class:`StageFailure` carrying what the supervisor reports (``failure.json``).
"""
import time

from distgrad.distributed import rpc
from distgrad.futures import wait_all

from . import stage as _stage

__all__ = ["StageCalls", "StageFailure", "FAILURE_NOTICE"]

FAILURE_NOTICE = 1.0  # s: how long a stage's word of the step that raised may take
_NEIGHBOUR = "StageFailedError"  # the error of a stage whose neighbour failed first


class StageFailure(Exception):
    """A stage failed or became unreachable; carries what the supervisor reports."""

    def __init__(self, record):
        super().__init__(record["message"])
        self.record = record


def _error_of(future):
    if not future.done():
        return None
    try:
        future.value()
    except Exception as e:  # noqa: BLE001 - the caller decides what it means
        return e
    return None


class StageCalls:
    """Calls to ``workers`` (``workers[k]`` is rank k + 1; ``grid`` describes each one's
    place), with ``timeout`` (RPC seconds, 0: none) and the world's ``heartbeat_timeout``."""

    def __init__(self, workers, grid, timeout, heartbeat_timeout):
        self.workers, self.grid = workers, grid
        self.timeout, self.heartbeat_timeout = timeout, heartbeat_timeout
        self.seq = 0

    def next_seq(self):
        """The sequence number of the next command (stages run commands in this order)."""
        self.seq += 1
        return self.seq

    def to_all(self, fn, args_of, timeout=None):
        """Send ``fn(*args_of(k))`` to every worker ``k``; return the futures."""
        return [rpc.rpc_async(w, fn, args_of(k), timeout=self.timeout if timeout is None
                              else timeout) for k, w in enumerate(self.workers)]

    def gather(self, futures, step):
        """The results of one command on every worker, or StageFailure naming the culprit.

        Waits for all futures but stops at the first error: a stage that is waiting
        for a dead neighbour would otherwise keep this waiting until its timeout.
        """
        try:
            return wait_all(futures)
        except Exception:  # noqa: BLE001 - the first that failed names its stage
            failed = self._failed(futures)
            raise self.diagnose(*failed[0], step) from None

    @staticmethod
    def _failed(futures):
        """``[(worker index, error)]`` of the futures that failed, a stage's own error
        first: a stage whose neighbour failed raises too (StageFailedError), and may be
        heard first; its neighbour's answer is given a moment to arrive."""
        def failed():
            errors = [(k, _error_of(f)) for k, f in enumerate(futures)]
            errors = [(k, e) for k, e in errors if e is not None]
            return sorted(errors, key=lambda ke: _NEIGHBOUR in (getattr(ke[1], "remote_type",
                                                                        None) or ""))
        errors = failed()
        deadline = time.monotonic() + FAILURE_NOTICE
        while _NEIGHBOUR in (getattr(errors[0][1], "remote_type", None) or "") and \
                time.monotonic() < deadline and not all(f.done() for f in futures):
            next(f for f in futures if not f.done()).wait_done(0.05)
            errors = failed()
        return errors

    def diagnose(self, stage, error, step):
        """Which worker is at fault: a probe finds a dead or stopped one within the
        heartbeat bound; otherwise ``stage``, whose call raised ``error`` in ``step``."""
        probes = [rpc.rpc_async(w, _stage.clock, timeout=self.heartbeat_timeout + 2.0)
                  for w in self.workers]
        culprit, reason, message = stage, "error", str(error)
        for k, p in enumerate(probes):
            try:
                p.wait()
            except Exception as e:  # noqa: BLE001 - unreachable or timed out: this one
                culprit, reason, message = k, "unreachable", str(e)
                break
        text, _, remote_tb = message.partition("\n\nRemote traceback")
        traceback = remote_tb.partition(":\n")[2] if remote_tb else ""
        if reason == "error":  # name the exception's class, as a traceback's last line does
            kind = getattr(error, "remote_type", None) or type(error).__name__
            if not text.startswith(kind):
                text = f"{kind.removeprefix('builtins.')}: {text}"
            traceback = getattr(error, "remote_traceback", None) or traceback
        return StageFailure({
            "worker": self.workers[culprit], "rank": culprit + 1,
            "place": self.grid.describe(culprit),
            "step": step + 1, "reason": reason, "message": text.strip(),
            "traceback": traceback})

"""``CheckpointException``: what every rank raises when a save or load failed on any rank."""

__all__ = ["CheckpointException"]


class CheckpointException(BaseException):  # PyTorch derives it from BaseException
    """A step of a checkpoint failed on some ranks: ``failures`` maps each of those ranks
    to its exception (rebuilt from its type name, message and traceback where it
    happened on another rank)."""

    def __init__(self, msg, failures, tracebacks=None):
        super().__init__(msg, failures)
        self._failures = failures
        self._tracebacks = tracebacks or {}

    @property
    def failures(self):
        return self._failures

    def __str__(self):
        parts = [f"CheckpointException ranks:{sorted(self._failures)}"]
        for rank, exc in sorted(self._failures.items()):
            tb = self._tracebacks.get(rank) or f"{type(exc).__name__}: {exc}\n"
            parts.append(f"(RANK {rank}) {tb.rstrip()}")
        return "\n".join(parts)

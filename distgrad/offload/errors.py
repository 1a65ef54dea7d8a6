"""The errors of activation offloading: every one names the file or the store at fault."""

__all__ = ["OffloadError", "CorruptRecordError", "StoreError"]


class OffloadError(RuntimeError):
    """A saved tensor could not be stored or brought back (RuntimeError, as PyTorch's
    autograd errors)."""


class CorruptRecordError(OffloadError):
    """An offloaded record was torn, truncated or overwritten: its checksum, size or
    header does not match what was written. Raised instead of returning wrong data."""


class StoreError(OffloadError):
    """The activation store died, stopped answering, refused a request or lost a blob."""

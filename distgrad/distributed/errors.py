"""``torch.distributed``'s exception classes: every one is a ``RuntimeError``.

``DistBackendError`` is what a collective raises when it cannot complete (a
peer died or left, the group timed out, ranks called different collectives);
``DistStoreError`` a store operation that timed out or was refused;
``DistNetworkError`` a store or rendezvous that cannot be reached.
"""

__all__ = ["DistError", "DistBackendError", "DistNetworkError", "DistStoreError"]


class DistError(RuntimeError):
    """Base class of the errors of ``distgrad.distributed``'s process groups and stores."""


class DistBackendError(DistError):
    """A collective or point-to-point operation failed."""


class DistNetworkError(DistError):
    """A store or a peer could not be reached."""


class DistStoreError(DistError):
    """A store operation failed or timed out."""

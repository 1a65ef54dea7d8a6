"""The errors of a rendezvous, as ``torch.distributed.elastic.rendezvous.api`` names them
(here each carries a message that names the node, host or setting at fault)."""

__all__ = ["RendezvousError", "RendezvousClosedError", "RendezvousTimeoutError",
           "RendezvousConnectionError", "RendezvousStateError", "RendezvousGracefulExitError"]


class RendezvousError(Exception):
    """The base of the rendezvous errors."""


class RendezvousClosedError(RendezvousError):
    """The rendezvous is closed (the job finished or failed, or its nodes disagreed)."""


class RendezvousTimeoutError(RendezvousError):
    """A rendezvous did not complete in time."""


class RendezvousConnectionError(RendezvousError):
    """The store the agents meet at cannot be reached (or refused this agent)."""


class RendezvousStateError(RendezvousError):
    """The rendezvous state in the store is not one an agent of this version wrote."""


class RendezvousGracefulExitError(RendezvousError):
    """This node was not needed and leaves without failing."""

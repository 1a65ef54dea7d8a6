"""``torch.distributed.elastic.rendezvous``: how the torchrun agents of several nodes meet
(``distributed/run.py`` with ``--nnodes`` above 1), round after round.

``rendezvous_store``  the store they meet at: served by one agent, authenticated and
                      encrypted with the world secret
``state``             what the store holds: the rounds, their nodes, who waits, what
                      ended the last round; each node's heartbeat
``handler``           one agent's side: join a round (static: the nodes' ranks are
                      given; c10d: the first min..max nodes, a last call), watch it, end
                      it for everyone
"""
from .api import (RendezvousClosedError, RendezvousConnectionError, RendezvousError,
                  RendezvousGracefulExitError, RendezvousStateError, RendezvousTimeoutError)

__all__ = ["RendezvousError", "RendezvousClosedError", "RendezvousTimeoutError",
           "RendezvousConnectionError", "RendezvousStateError", "RendezvousGracefulExitError"]

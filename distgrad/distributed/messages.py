"""What the ranks of a process-group world send each other, and how much of it may wait.

Every message is an RPC CALL frame (``rpc/wire.py``) whose header carries
``[kind, group, a, b, meta]``, then the payload:

* ``COLL``: a message of a collective (``programs.py``): ``a`` its seq in the group,
  ``b`` the step of its program, ``meta`` the sender's fingerprint.
* ``P2P``: a ``send`` (``p2p.py``): ``a`` its tag.
* ``MISMATCH``: ranks called different collectives (``programs.py``): ``a`` the
  seq, ``meta`` the fingerprint of what the sender called there (None: nothing).
* ``ABORT``: the sender broke the group (``comm.py``): ``a`` the seq, ``meta`` why.

The kinds live here, in one place, so that no two modules give a number two meanings.
"""
import collections

__all__ = ["COLL", "P2P", "MISMATCH", "ABORT", "Backlog"]

COLL, P2P, MISMATCH, ABORT = 0, 1, 2, 3


class Backlog:
    """How many messages each peer has waiting here for someone to ask for them: a
    program that has not reached them, a recv not posted yet, a group not made here yet.

    One budget per peer across all three, so that a peer that runs ahead (or a buggy
    one) cannot grow this process's memory without bound; ``limit`` is generous
    because a correct peer may run many collectives ahead of this rank.
    """

    limit = 1 << 16

    def __init__(self):
        self._count = collections.Counter()

    def keep(self, src):
        """Count one more message of ``src`` kept for later; False (nothing counted)
        when ``src`` already has ``limit`` of them waiting."""
        if self._count[src] >= self.limit:
            return False
        self._count[src] += 1
        return True

    def taken(self, src):
        """A kept message of ``src`` was used or thrown away."""
        self._count[src] -= 1

"""The rendezvous of a one-node launch: no store and no other agents; the round is this
node alone, and its restarts are counted here. It offers what the agent's loop uses of a
multi-node rendezvous (``handler.py``), so one loop runs both."""
import os
import socket

from .handler import Ended
from .state import Node

__all__ = ["LocalRendezvous"]


class LocalRendezvous:
    """One node whose workers meet at ``master`` (MASTER_ADDR, MASTER_PORT)."""

    def __init__(self, master, run_id, nproc, role, max_restarts):
        self.master, self.run_id, self.max_restarts = master, run_id, max_restarts
        self.host = socket.getfqdn()
        self.me = Node("local", self.host, master[0], os.getpid(), 0, role, nproc)
        self.restarts = 0

    def where(self):
        return "this node (no store)"

    def next_rendezvous(self):
        return _LocalRound(self)

    def interrupted(self, sig):
        pass  # nobody else to tell

    def shutdown(self, reachable=True):
        pass


class _LocalRound:
    group_rank = 0

    def __init__(self, rdzv):
        self._rdzv = rdzv
        self.nodes, self.run_id = [rdzv.me], rdzv.run_id
        self.round = self.restarts = rdzv.restarts

    def first_rank(self):
        return 0

    def master(self):
        return self._rdzv.master

    def check(self, membership=True):
        return None

    def fail(self, failures):
        text = "; ".join(f.describe() for f in failures)
        if self.restarts >= self._rdzv.max_restarts:
            return Ended("failed", failures, text, final=True)
        self._rdzv.restarts += 1
        return Ended("failed", failures, text, final=False)

    def finished(self):
        return None

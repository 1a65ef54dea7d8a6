"""The shutdown barrier, held by rank 0: nobody closes while a peer may still call it.

Every rank calls ``@barrier`` on rank 0 once its own outstanding calls are done;
rank 0 answers all of them once every rank has arrived, rank 0 itself last, so
the replies are on their way before rank 0 closes its sockets. An arrival
counts for the rank that sent it (the request's source), never for a rank named
in a message, and a rank arrives once.
"""
import threading
import time

from .errors import RpcTimeoutError, WorkerUnreachableError
from ..futures import Future

__all__ = ["ShutdownBarrier", "MET"]

#: What rank 0 says as it leaves once every rank met at its barrier. Its replies to the
#: barrier and its LEAVE travel on different connections, so a LEAVE can overtake a reply
#: (one to a peer that rank 0's thread had no connection to yet, made as the reply left):
#: a rank still waiting for its reply then knows from this that the barrier was met.
MET = "it shut down after every rank met at the shutdown barrier"


class ShutdownBarrier:
    def __init__(self, world_size):
        self.world_size = world_size
        self._lock = threading.Lock()
        self._arrived = {}

    def arrive(self, rank):
        """The Future that answers ``rank``, completed once everyone arrived."""
        with self._lock:
            fut = self._arrived.get(rank)
            if fut is None:
                fut = self._arrived[rank] = Future()
            ready = len(self._arrived) == self.world_size
            futures = sorted(self._arrived.items(), reverse=True) if ready else ()
        for _, f in futures:  # rank 0 last
            if not f.done():
                f.set_result(None)
        return fut

    def missing(self):
        with self._lock:
            return [r for r in range(self.world_size) if r not in self._arrived]

    def wait_all(self, deadline, down, describe):
        """Rank 0: arrive and wait for everyone; ``down(rank)`` says why a rank is gone.
        On failure the ranks that did arrive are released with the error too."""
        fut = self.arrive(0)
        while not fut.wait_done(0.2):
            err = None
            gone = [(r, down(r)) for r in self.missing() if down(r)]
            if gone:
                r, why = gone[0]
                err = WorkerUnreachableError(f"shutdown barrier: {describe(r)} did not arrive: "
                                             f"{why}")
            elif time.monotonic() > deadline:
                err = RpcTimeoutError("shutdown barrier timed out waiting for "
                                      + ", ".join(describe(r) for r in self.missing()))
            if err is not None:
                with self._lock:
                    waiting = list(self._arrived.values())
                for f in waiting:
                    if not f.done():
                        f.set_exception(err)
                raise err

"""The members of a formed world: who is who, by name and rank, as the rendezvous told us.

Everything that names a peer (in a call, an error, a log line) asks this table, so a
worker is described the same way everywhere.
"""
from .errors import UnknownWorkerError
from .worker_info import WorkerInfo

__all__ = ["Members"]


class Members:
    """The world's workers (``workers[rank]`` is a :class:`WorkerInfo`), from the
    rendezvous table ``[[name, rank, endpoint, auth], ...]``."""

    def __init__(self, table):
        self.workers = [WorkerInfo(n, r) for n, r, _, _ in table]
        self.size = len(self.workers)
        self._by_name = {w.name: w for w in self.workers}

    def worker_info(self, to):
        """The :class:`WorkerInfo` of ``to``: a name, a WorkerInfo or a rank."""
        if isinstance(to, WorkerInfo):
            to = to.id
        if isinstance(to, str):
            w = self._by_name.get(to)
            if w is None:
                raise UnknownWorkerError(f"unknown worker {to!r}; the world has "
                                         f"{sorted(self._by_name)}")
            return w
        if isinstance(to, int) and not isinstance(to, bool) and 0 <= to < self.size:
            return self.workers[to]
        raise UnknownWorkerError(f"unknown worker {to!r}: a name, a WorkerInfo or a rank in "
                                 f"0..{self.size - 1}")

    def describe(self, rank):
        return f"worker {self.workers[rank].name!r} (rank {rank})"

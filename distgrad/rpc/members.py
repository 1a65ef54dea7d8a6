"""The members of a formed world: who is who, by name and rank, as the rendezvous told us.

Everything that names a peer (in a call, an error, a log line) asks this table, so a
worker is described the same way everywhere.
"""
from ..utils.addresses import endpoint_host
from .errors import UnknownWorkerError
from .worker_info import WorkerInfo

__all__ = ["Members"]


class Members:
    """The world's workers (``workers[rank]`` is a :class:`WorkerInfo`), from the
    rendezvous table ``[[name, rank, endpoint, auth], ...]``, and the host each runs on
    (``hosts[rank]``: its endpoint's address; None for a unix socket)."""

    def __init__(self, table):
        self.workers = [WorkerInfo(n, r) for n, r, _, _ in table]
        self.size = len(self.workers)
        self._by_name = {w.name: w for w in self.workers}
        self.hosts = [endpoint_host(ep) for _, _, ep, _ in table]
        # only a world that spans hosts names them (on one host it would say nothing)
        self.spans_hosts = len({h for h in self.hosts if h is not None}) > 1

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
        where = f" on host {self.hosts[rank]}" if self.spans_hosts else ""
        return f"worker {self.workers[rank].name!r} (rank {rank}){where}"

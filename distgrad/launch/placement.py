"""Which host each process of a launch runs on, and what a lost host took with it.

A launch that spans hosts asks every worker where it runs once the world has formed
(:func:`where`, run on the worker over RPC; workers allow this module) and writes
the answers to ``hosts.json`` in the run directory. When a worker stops answering,
:meth:`Placement.lost_host` probes the others on its host: if none of them answers
either (and it is not the coordinator's own host), the host is reported as lost,
with every rank it ran, instead of one worker that stopped.

A host is named by its workers' host name where that tells hosts apart, else by the
name ``/etc/hosts`` gives its address (containers, and simulated hosts, often share
one host name; DNS is not asked: a reverse lookup can take seconds where it does not
answer), and always with the address:

>>> p = Placement({0: {"name": "coordinator", "hostname": "a", "address": "10.0.0.1"},
...                1: {"name": "worker1", "hostname": "b", "address": "10.0.0.2"}})
>>> p.label("10.0.0.2"), p.ranks_at("10.0.0.2")
('b (10.0.0.2)', [1])
"""
import socket

from distgrad.distributed import rpc
from distgrad.utils import addresses

from .contracts import HostInfo

__all__ = ["where", "Placement", "HOSTS"]

HOSTS = "hosts.json"


def where(toward):
    """This process's host name and the address it is reached at from ``toward`` (the
    coordinator's address): run on each worker."""
    return HostInfo(hostname=socket.gethostname(), address=addresses.choose(toward).advertise)


def _hosts_file_name(address, path="/etc/hosts"):
    """The first name ``/etc/hosts`` gives ``address`` (None: none)."""
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            for line in fh:
                fields = line.partition("#")[0].split()
                if len(fields) > 1 and fields[0] == address:
                    return fields[1]
    except OSError:
        pass
    return None


class Placement:
    """``{rank: {"name", "hostname", "address"}}`` of a world, and how to name its hosts."""

    def __init__(self, ranks):
        self.ranks = {int(r): dict(v) for r, v in ranks.items()}
        self._names = self._host_names()

    @classmethod
    def gather(cls, workers, coordinator_address, timeout):
        """Ask every worker (``workers[k]`` is rank k + 1) where it runs; a worker that
        does not answer is left out (the training finds and reports it)."""
        futures = [rpc.rpc_async(w, where, (coordinator_address,), timeout=timeout)
                   for w in workers]
        ranks = {0: {"name": "coordinator", "hostname": socket.gethostname(),
                     "address": coordinator_address}}
        for k, (name, future) in enumerate(zip(workers, futures)):
            try:
                host = future.wait()
                ranks[k + 1] = {"name": name, "hostname": host.hostname,
                                "address": host.address}
            except Exception:  # noqa: BLE001 - unreachable: the run reports it
                pass
        return cls(ranks)

    def answering(self, ranks, timeout):
        """``{rank: whether it answers a call within timeout}``, asked all at once."""
        toward = self.ranks[0]["address"]
        futures = {r: rpc.rpc_async(self.ranks[r]["name"], where, (toward,), timeout=timeout)
                   for r in ranks}
        out = {}
        for r, future in futures.items():
            try:
                future.wait()
                out[r] = True
            except Exception:  # noqa: BLE001 - unreachable or timed out: not answering
                out[r] = False
        return out

    def _host_names(self):
        """address -> the name to show: the host name its processes report, unless
        another address reports the same one; then the reverse lookup of the address."""
        by_address = {}
        for info in self.ranks.values():
            by_address.setdefault(info["address"], info["hostname"])
        shared = {n for n in by_address.values() if list(by_address.values()).count(n) > 1}
        names = {}
        for address, hostname in by_address.items():
            if hostname not in shared:
                names[address] = hostname
                continue
            names[address] = _hosts_file_name(address)
        return names

    def label(self, address):
        name = self._names.get(address)
        return f"{name} ({address})" if name and name != address else address

    def host_of(self, rank):
        info = self.ranks.get(rank)
        return None if info is None else info["address"]

    def ranks_at(self, address):
        return sorted(r for r, info in self.ranks.items() if info["address"] == address)

    def lost_host(self, rank, timeout):
        """The record of ``rank``'s host when that host is lost: none of its other ranks
        answers within ``timeout`` either (their heartbeats stopped with its, so the RPC
        layer knows them dead by then); None when it is the coordinator's host, not
        known, or one of its ranks still answers (one process failed, not the host)."""
        address = self.host_of(rank)
        if address is None or address == self.host_of(0):
            return None
        ranks = self.ranks_at(address)
        if any(self.answering([r for r in ranks if r != rank], timeout).values()):
            return None
        return {"name": self._names.get(address), "address": address, "label":
                self.label(address), "ranks": ranks,
                "workers": [self.ranks[r]["name"] for r in ranks]}

    def to_json(self):
        return {str(r): dict(info, host=self.label(info["address"]))
                for r, info in sorted(self.ranks.items())}

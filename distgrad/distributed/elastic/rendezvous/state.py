"""What the torchrun agents of a multi-node launch share in their store, and how they
change it.

One key holds the rendezvous state (msgpack). It changes only by compare-and-set, so two
agents that change it at once cannot lose each other's change (the loser reads again and
retries):

==========  ==========================================================================
round       the number of the current round
complete    whether its nodes are settled (``nodes`` is then in group-rank order)
nodes       the nodes of the round (:class:`Node`)
waiting     nodes that came while a round ran: with ``c10d`` they make the running ones
            start a new round (torchrun's ``num_nodes_waiting``)
restarts    how many rounds ended in a failure: every agent's
            ``TORCHELASTIC_RESTART_COUNT``, so all of them agree on it
config      what every agent must be started with alike (backend, --nnodes,
            --max-restarts), as the first agent wrote it
ended       why the last round ended: [round, why, failure records]
closed      None, or why no round will come: [why, failure records] (the job finished,
            failed for good, or its nodes disagreed)
lost        the nodes that stopped heartbeating, for the errors that name them
==========  ==========================================================================

Each agent increments a heartbeat key of its own every ``keep_alive_interval``; a watcher
times the changes it sees on its own clock (the hosts' clocks need not agree), and a
node whose count stands still for ``keep_alive_interval * keep_alive_max_attempt`` is lost.
"""
import copy
import threading
import time

import msgpack

from .api import RendezvousStateError

__all__ = ["Node", "State", "SharedState", "Heartbeat", "Liveness"]

_MAX_UPDATES = 10_000   # compare-and-set attempts of one update (each loss is another's progress)


class Node:
    """One agent in the rendezvous: ``id`` (address, pid, a counter: unique), ``host`` (its
    host's name and address, for messages), ``addr`` (the address its host is reached
    at), ``node_rank`` (static; -1 with c10d), ``role`` and ``nproc`` (its workers)."""

    __slots__ = ("id", "host", "addr", "pid", "node_rank", "role", "nproc")

    def __init__(self, id, host, addr, pid, node_rank, role, nproc):
        self.id, self.host, self.addr, self.pid = id, host, addr, pid
        self.node_rank, self.role, self.nproc = node_rank, role, nproc

    def entry(self):
        return [self.id, self.host, self.addr, self.pid, self.node_rank, self.role, self.nproc]

    @classmethod
    def of(cls, entry):
        if type(entry) is not list or len(entry) != 7 \
                or not all(type(v) is str for v in entry[:3] + entry[5:6]) \
                or not all(type(v) is int for v in entry[3:5] + entry[6:]):
            raise RendezvousStateError(f"a node of the rendezvous state is malformed: "
                                       f"{str(entry)[:200]}")
        return cls(*entry)

    def __eq__(self, other):
        return isinstance(other, Node) and other.id == self.id

    def __hash__(self):
        return hash(self.id)

    def name(self):
        """How a message names this node: its node rank (static) and its host."""
        return (f"node rank {self.node_rank} ({self.host})" if self.node_rank >= 0
                else f"the node on {self.host}")


class State:
    """The rendezvous state (see the module's docstring)."""

    def __init__(self, config):
        self.round, self.complete, self.restarts = 0, False, 0
        self.nodes, self.waiting, self.lost = [], [], []
        self.config, self.ended, self.closed = config, None, None

    def ids(self, which="nodes"):
        return [n.id for n in getattr(self, which)]

    def pack(self):
        return msgpack.packb([1, self.round, self.complete, self.restarts,
                              [n.entry() for n in self.nodes],
                              [n.entry() for n in self.waiting],
                              [n.entry() for n in self.lost],
                              self.config, self.ended, self.closed])

    @classmethod
    def unpack(cls, raw):
        try:
            fields = msgpack.unpackb(raw, raw=False)
            version, rnd, complete, restarts, nodes, waiting, lost, config, ended, closed = fields
            if version != 1 or type(rnd) is not int or type(complete) is not bool \
                    or type(restarts) is not int or type(config) is not dict \
                    or not all(type(x) is list for x in (nodes, waiting, lost)):
                raise ValueError
        except (ValueError, TypeError, msgpack.UnpackException):
            raise RendezvousStateError(
                "the rendezvous state in the store is not one a distgrad agent of this version "
                "wrote: another program, or another version of distgrad, uses this "
                "--rdzv-id at this endpoint") from None
        state = cls(config)
        state.round, state.complete, state.restarts = rnd, complete, restarts
        state.nodes = [Node.of(e) for e in nodes]
        state.waiting = [Node.of(e) for e in waiting]
        state.lost = [Node.of(e) for e in lost]
        state.ended, state.closed = ended, closed
        return state


class SharedState:
    """The rendezvous state at ``key`` of ``store``, read and changed atomically."""

    def __init__(self, store, config, key="state"):
        self.store, self.key = store, key
        self._initial = State(config).pack()

    def read(self):
        """(state, its bytes); the first reader writes the initial state (its config)."""
        raw = self.store.compare_set(self.key, b"", self._initial)
        return State.unpack(raw), raw

    def update(self, change):
        """Apply ``change(state)`` (it edits the state and returns True, or returns False
        to leave it) atomically; returns the state as it is afterwards."""
        state, raw = self.read()
        for _ in range(_MAX_UPDATES):
            edited = copy.deepcopy(state)
            if not change(edited):
                return state
            new = edited.pack()
            now = self.store.compare_set(self.key, raw, new)
            if now == new:
                return edited
            state, raw = State.unpack(now), now
        raise RendezvousStateError(f"the rendezvous state changed under this agent "
                                   f"{_MAX_UPDATES} times in a row")


def _hb_key(node_id):
    return f"heartbeat/{node_id}"


class Heartbeat:
    """A thread that increments this node's heartbeat count every ``interval`` s until
    :meth:`stop`. A store that stops answering ends it: the agent's own calls report that."""

    def __init__(self, store, node_id, interval):
        self._store, self._key, self._interval = store, _hb_key(node_id), interval
        self._stop = threading.Event()
        self._store.add(self._key, 1)
        self._thread = threading.Thread(target=self._beat, name="rendezvous-heartbeat",
                                        daemon=True)
        self._thread.start()

    def _beat(self):
        while not self._stop.wait(self._interval):
            try:
                self._store.add(self._key, 1)
            except Exception:  # noqa: BLE001 - the store is gone; the main loop says so
                return

    def stop(self, timeout):
        """Stop and join the thread; False if it is still in a store call after ``timeout``
        s (a store that does not answer holds it up to the store's timeout)."""
        self._stop.set()
        self._thread.join(timeout)
        return not self._thread.is_alive()


class Liveness:
    """Which nodes stopped heartbeating: a count that stood still for ``period`` s of
    this watcher's clock."""

    def __init__(self, store, period):
        self._store, self.period = store, period
        self._seen = {}       # node id -> (count, when it was first seen at that count)
        self._checked, self._stale = 0.0, []

    def stale(self, nodes, exclude=None):
        """The nodes of ``nodes`` (but ``exclude``) that are lost; the counts are read at
        most every ``period / 4`` s."""
        now = time.monotonic()
        if now - self._checked < self.period / 4:
            return [n for n in self._stale if n in nodes]
        self._checked = now
        stale = []
        for node in nodes:
            if node.id == exclude:
                continue
            count = self._store.add(_hb_key(node.id), 0)
            seen = self._seen.get(node.id)
            if seen is None or seen[0] != count:
                self._seen[node.id] = (count, now)
            elif now - seen[1] >= self.period:
                stale.append(node)
        self._stale = stale
        return stale

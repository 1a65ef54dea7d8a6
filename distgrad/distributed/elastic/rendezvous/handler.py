"""One torchrun agent's side of a multi-node rendezvous: join a round, watch it, end it.

A round forms in the shared state (``state.py``) and is settled once:

* static (``--rdzv-backend static``, the default): every node of ``--nnodes N`` has its
  ``--node-rank``, and the round is complete when all N joined; group rank = node rank.
* ``c10d`` (``--nnodes MIN:MAX``): the round is complete at once with MAX nodes, or with
  at least MIN once no other node came for ``last_call_timeout`` s; group ranks follow
  the nodes' ids (address, pid), as torchrun's.

A node that comes while a round runs waits (c10d: the running agents see it, as
torchrun's ``num_nodes_waiting``, and start a new round that takes it in; this does not
count as a restart). A round ends for every node at once when any agent ends it: a
worker failed, a node's agent stopped heartbeating (its host is lost), a node waits to
join, or an agent got a signal. A failure or a loss counts one restart for all of them
(the state keeps the count); past ``--max-restarts`` the rendezvous is closed with the
failures, and every agent reports them. With fewer than MIN nodes left a new round does
not form, and the agents fail after ``join_timeout`` naming the nodes lost.
"""
import itertools
import logging
import os
import signal
import socket
import time

import msgpack

from ....utils import addresses
from ....utils.ports import free_port
from ...store import PrefixStore
from ..workers import Failure
from .api import (RendezvousClosedError, RendezvousConnectionError, RendezvousError,
                  RendezvousStateError, RendezvousTimeoutError)
from .rendezvous_store import open_store, parse_endpoint
from .state import Heartbeat, Liveness, Node, SharedState

__all__ = ["Settings", "Ended", "Rendezvous", "Round", "host_label"]

log = logging.getLogger("distgrad.distributed")

_POLL = 0.05                  # s between looks at the state while joining or waiting
_EXIT_BARRIER_TIMEOUT = 300.0  # torchrun's agent waits this long for the others to finish
_ids = itertools.count()


def host_label(addr):
    """How messages name the host at ``addr``: its name (as the hosts list it) and address."""
    try:
        name = socket.gethostbyaddr(addr)[0]
    except OSError:
        name = socket.gethostname()
    return addr if name == addr else f"{name} ({addr})"


def _seconds(conf, key, default):
    value = conf.get(key)
    if value is None:
        return float(default)
    try:
        seconds = float(value)
    except ValueError:
        raise ValueError(f"The rendezvous configuration option '{key}' does not represent a "
                         "valid number of seconds.") from None
    if seconds <= 0:
        raise ValueError(f"The rendezvous configuration option '{key}' ({value}) must be "
                         "positive.")
    return seconds


class Settings:
    """What an agent's rendezvous is made of, from torchrun's command line."""

    def __init__(self, backend, min_nodes, max_nodes, node_rank, run_id, endpoint,
                 max_restarts, conf, master_addr=None):
        self.backend, self.min_nodes, self.max_nodes = backend, min_nodes, max_nodes
        self.node_rank, self.run_id, self.max_restarts = node_rank, run_id, max_restarts
        self.host, self.port = endpoint
        self.master_addr = master_addr           # static: the workers' MASTER_ADDR
        static = backend == "static"
        self.join_timeout = _seconds(conf, "timeout" if static else "join_timeout", 600)
        self.last_call = 0.0 if static else _seconds(conf, "last_call_timeout", 30)
        self.close_timeout = _seconds(conf, "close_timeout", 30)
        self.keep_alive = _seconds(conf, "keep_alive_interval", 5)
        attempts = conf.get("keep_alive_max_attempt", "3")
        if not attempts.isdigit() or int(attempts) < 1:
            raise ValueError("The rendezvous configuration option 'keep_alive_max_attempt' "
                             "must be a positive integer.")
        self.lost_after = self.keep_alive * int(attempts)
        self.read_timeout = _seconds(conf, "read_timeout", 60)
        if conf.get("store_type", "tcp").lower() != "tcp":
            raise ValueError(f"--rdzv-conf store_type={conf['store_type']}: distgrad's agents "
                             "meet in a TCP store only")
        self.is_host = conf.get("is_host")
        if self.is_host is not None:
            self.is_host = self.is_host.lower() in ("1", "true", "t", "yes", "y")

    def config(self):
        """What every node must be started with alike."""
        nnodes = str(self.max_nodes) if self.backend == "static" else \
            f"{self.min_nodes}:{self.max_nodes}"
        return {"backend": self.backend, "nnodes": nnodes, "max_restarts": self.max_restarts}

    def where(self):
        return f"{self.host}:{self.port}"


class Ended:
    """Why a round ended: ``why`` (failed, lost, membership, interrupted, finished,
    config), the failures recorded, a text, and ``final`` (no round follows)."""

    def __init__(self, why, failures, text, final):
        self.why, self.failures, self.text, self.final = why, failures, text, final


def _failures(records):
    try:
        return [Failure.from_record(r) for r in records]
    except (ValueError, TypeError):
        raise RendezvousStateError("a failure recorded in the rendezvous state is malformed") \
            from None


class Rendezvous:
    """This agent in the rendezvous of ``settings``; ``nproc`` and ``role``: its workers.
    ``secret``: the world secret (authenticates the store), or None."""

    def __init__(self, settings, nproc, role, secret, local_addr=None):
        self.settings = s = settings
        serve = s.node_rank == 0 if s.backend == "static" else (
            s.is_host if s.is_host is not None else _is_this_host(s.host))
        fallback = s.backend != "static" and s.is_host is None
        try:
            addr = local_addr or addresses.choose(s.host, "pg").advertise
        except addresses.AddressError as e:
            raise RendezvousConnectionError(f"cannot meet the other nodes' agents at "
                                            f"{s.where()}: {e}") from None
        self.host = host_label(addr)
        self.me = Node(f"{addr}_{os.getpid()}_{next(_ids)}", self.host, addr, os.getpid(),
                       s.node_rank if s.backend == "static" else -1, role, nproc)
        store, self.served = open_store(s.host, s.port, serve, secret=secret,
                                        timeout=s.join_timeout, read_timeout=s.read_timeout,
                                        fallback=fallback)
        self._server = store
        self.store = PrefixStore(f"distgrad/rendezvous/{s.run_id}", store)
        # the first agent to read the state writes it, with its options and its name
        self.shared = SharedState(self.store, dict(s.config(), by=self.me.name()))
        self.liveness = Liveness(self.store, s.lost_after)
        try:
            self._heartbeat = Heartbeat(self.store, self.me.id, s.keep_alive)
        except BaseException:
            store.close()
            raise
        self.current = None

    def where(self):
        """The store's address, as messages name it."""
        return self.settings.where()

    # ------------------------------------------------------------------ joining
    def next_rendezvous(self):
        """Join the next round and return it once complete (:class:`Round`)."""
        s = self.settings
        deadline = time.monotonic() + s.join_timeout
        since_min = None
        while True:
            state, _ = self.shared.read()
            if state.closed:
                raise RendezvousClosedError(f"the rendezvous '{s.run_id}' at {s.where()} is "
                                            f"closed: {state.closed[2]}")
            self._check_config(state)
            # each step changes the state at most once, then looks again (after a pause
            # when nothing changed: the other agents' turn)
            if state.complete:
                if self.me in state.nodes:
                    self.current = Round(self, state)
                    return self.current
                if s.backend != "static" and len(state.nodes) >= s.max_nodes:
                    deadline = time.monotonic() + s.join_timeout  # no room: wait for one
                if self._changed(self._wait):
                    continue
            elif self.me not in state.nodes:
                if self._changed(self._join):
                    continue
            else:
                n = len(state.nodes)
                since_min = (since_min or time.monotonic()) if n >= s.min_nodes else None
                if (n >= s.max_nodes or since_min is not None
                        and time.monotonic() - since_min >= s.last_call) \
                        and self._changed(self._complete):
                    continue
            lost = self.liveness.stale(state.nodes + state.waiting, exclude=self.me.id)
            if lost and self._changed(lambda st: _drop(st, lost, s.max_restarts)):
                continue
            if time.monotonic() > deadline:
                raise RendezvousTimeoutError(self._timeout_text(state))
            time.sleep(_POLL)

    def _changed(self, change):
        """Apply ``change`` to the shared state; whether it changed anything."""
        changed = []
        self.shared.update(lambda st: changed.append(change(st)) or changed[-1])
        return bool(changed and changed[-1])

    def _check_config(self, state):
        mine = self.settings.config()
        if {k: v for k, v in state.config.items() if k != "by"} == mine:
            return
        text = (f"{self.me.name()} was started with {_options(mine)}, but "
                f"{state.config.get('by', 'another node')} with {_options(state.config)}: "
                "every node needs the same")
        if not state.complete:  # the world cannot form: all fail; a running one goes on
            self.close("config", [], text)
        raise RendezvousError(text)

    def _join(self, state):
        if state.complete or self.me in state.nodes or state.closed:
            return False
        if len(state.nodes) >= self.settings.max_nodes:
            return self._wait(state)
        twin = [n for n in state.nodes if 0 <= n.node_rank == self.me.node_rank]
        if twin:
            raise RendezvousError(
                f"node rank {self.me.node_rank} is claimed by two agents: {twin[0].host} "
                f"(pid {twin[0].pid}) and {self.me.host} (pid {self.me.pid}); give every node "
                "its own --node-rank")
        state.waiting = [n for n in state.waiting if n != self.me]
        state.nodes.append(self.me)
        return True

    def _wait(self, state):
        if not state.complete or self.me in state.nodes or self.me in state.waiting:
            return False
        state.waiting.append(self.me)
        return True

    def _complete(self, state):
        s = self.settings
        n = len(state.nodes)
        if state.complete or state.closed or n < s.min_nodes:
            return False
        state.complete = True
        state.nodes.sort(key=(lambda node: node.node_rank) if s.backend == "static"
                         else (lambda node: node.id))
        state.waiting = [w for w in state.waiting if w not in state.nodes]
        return True

    def _timeout_text(self, state):
        s = self.settings
        joined = ", ".join(n.host for n in state.nodes) or "none"
        if s.backend == "static":
            have = {n.node_rank for n in state.nodes}
            missing = [r for r in range(s.max_nodes) if r not in have]
            held = [n for n in state.nodes if state.complete and n.node_rank == s.node_rank]
            text = (f"the static rendezvous '{s.run_id}' at {s.where()} did not complete "
                    f"within {s.join_timeout:g} s (the 'timeout' of --rdzv-conf): "
                    f"{len(state.nodes)} of {s.max_nodes} nodes joined round {state.round} "
                    f"({joined}); missing: node ranks {missing} (an agent that cannot "
                    "join says why on its host: it cannot reach this store, or holds "
                    "another world secret)")
            if held:
                text += (f"; this node's rank {s.node_rank} is held in the running round by "
                         f"{held[0].host} (pid {held[0].pid})")
        else:
            text = (f"the rendezvous '{s.run_id}' at {s.where()} did not reach --nnodes "
                    f"{s.min_nodes}:{s.max_nodes} within join_timeout={s.join_timeout:g} s: "
                    f"{len(state.nodes)} node(s) joined round {state.round} ({joined})")
        if state.lost:
            text += "; lost: " + ", ".join(f"{n.name()}, whose agent stopped heartbeating"
                                           for n in state.lost)
        return text

    # ------------------------------------------------------------------ ending
    def close(self, why, records, text):
        """Close the rendezvous (no round follows) unless it is closed already."""
        def change(state):
            if state.closed:
                return False
            state.closed = [why, records, text]
            return True
        self.shared.update(change)

    def interrupted(self, sig):
        """This agent got ``sig``: end its round for the others (best effort)."""
        rnd = self.current
        if rnd is None:
            return
        try:
            name = signal.Signals(sig).name
        except ValueError:
            name = str(sig)
        try:
            first = rnd.first_rank()
            failure = Failure(first, 0, os.getpid(), -int(sig), None, self.host,
                              f"the agent of {self.me.name()} got signal {name}")
            rnd.end("interrupted", [failure])
        except Exception as e:  # noqa: BLE001 - the store may be gone as well
            log.warning("could not tell the other agents that this one stops: %s", e)

    def shutdown(self, reachable=True):
        """Leave: stop heartbeating; the agent that serves the store keeps it up until the
        others left (or ``close_timeout``), so that each can read how the job ended.
        ``reachable`` False: the store is lost, nobody to tell."""
        if reachable:
            try:
                self.store.set(f"left/{self.me.id}", b"1")
            except Exception:  # noqa: BLE001 - nobody to tell after all
                pass
        if not self._heartbeat.stop(2.0):
            log.warning("the rendezvous heartbeat thread is left running: its call to the "
                        "store at %s hangs (the store's host is lost)", self.settings.where())
        if self.served:
            deadline = time.monotonic() + self.settings.close_timeout
            while time.monotonic() < deadline:
                state, _ = self.shared.read()
                others = [n for n in state.nodes + state.waiting
                          if n != self.me and n not in state.lost]
                if all(self.store.check([f"left/{n.id}"]) for n in others) \
                        or not [n for n in others if n not in self.liveness.stale(others)]:
                    break
                time.sleep(_POLL)
        self._server.close()


def _drop(state, lost, max_restarts):
    """Remove ``lost`` nodes from a forming round and from the waiting ones. A running
    round is its own agents' to end, unless every one of them is lost: then a waiting
    agent ends it as they would have (one restart, or closed past ``max_restarts``)."""
    before = (state.round, len(state.nodes), len(state.waiting))
    state.waiting = [n for n in state.waiting if n not in lost]
    if not state.complete:
        state.nodes = [n for n in state.nodes if n not in lost]
    elif state.nodes and all(n in lost for n in state.nodes) and not state.closed:
        text = "every node of the round was lost: " + ", ".join(n.host for n in state.nodes)
        if state.restarts >= max_restarts:
            state.closed = ["lost", [], text]
        else:
            state.ended = [state.round, "lost", [], text]
            state.round += 1
            state.restarts += 1
            state.complete, state.nodes = False, []
    state.lost += [n for n in lost if n not in state.lost]
    return (state.round, len(state.nodes), len(state.waiting)) != before or bool(state.closed)


def _options(config):
    return f"--rdzv-backend {config.get('backend')} --nnodes {config.get('nnodes')} " \
           f"--max-restarts {config.get('max_restarts')}"


def _is_this_host(host):
    try:
        return addresses.is_local(addresses.resolve(host, "the rendezvous host"))
    except addresses.AddressError:
        return False


class Round:
    """A complete round: ``nodes`` (:class:`Node`, by group rank), this node's
    ``group_rank``, the world's ``restarts`` so far and the ``run_id``."""

    def __init__(self, rdzv, state):
        self._rdzv = rdzv
        self.round, self.restarts, self.nodes = state.round, state.restarts, state.nodes
        self.group_rank = state.nodes.index(rdzv.me)
        self.run_id = rdzv.settings.run_id

    def first_rank(self):
        return sum(n.nproc for n in self.nodes[:self.group_rank])

    def master(self):
        """The workers' (MASTER_ADDR, MASTER_PORT): an address of group rank 0's host (static:
        --master-addr) and a port free there; or :class:`Ended` if the round ended first."""
        rdzv, key = self._rdzv, f"round/{self.round}/master"
        if self.group_rank == 0:
            addr = rdzv.settings.master_addr or rdzv.me.addr
            port = free_port(addresses.listen_address(addr))
            rdzv.store.set(key, msgpack.packb([addr, port]))
        while not rdzv.store.check([key]):
            ended = self.check(membership=False)
            if ended is not None:
                return ended
            time.sleep(_POLL)
        addr, port = msgpack.unpackb(rdzv.store.get(key), raw=False)
        return addr, port

    def check(self, membership=True):
        """None while the round runs; :class:`Ended` once it ended (here: nodes wait to join
        (with ``membership``), or a node of it stopped heartbeating; or elsewhere)."""
        rdzv = self._rdzv
        state, _ = rdzv.shared.read()
        ended = self._ended(state)
        if ended is not None:
            return ended
        s = rdzv.settings
        if membership and s.backend != "static" and state.waiting \
                and len(state.nodes) < s.max_nodes:
            return self.end("membership", [], "new node(s) wait to join: " +
                            ", ".join(n.host for n in state.waiting))
        lost = rdzv.liveness.stale(self.nodes, exclude=rdzv.me.id)
        if lost:
            return self.end("lost", [self._lost(n) for n in lost], lost=lost)
        return None

    def _lost(self, node):
        i = self.nodes.index(node)
        first = sum(n.nproc for n in self.nodes[:i])
        ranks = f"rank {first}" if node.nproc == 1 else f"ranks {first}-{first + node.nproc - 1}"
        return Failure(first, 0, node.pid, None, None, node.host,
                       f"{node.name()} was lost with its {ranks}: its agent stopped "
                       f"heartbeating for {self._rdzv.settings.lost_after:g} s")

    def fail(self, failures):
        """This node's workers failed: end the round for all (the first end recorded wins)."""
        return self.end("failed", failures)

    def end(self, why, failures, text=None, lost=()):
        rdzv, s = self._rdzv, self._rdzv.settings
        records = [f.record() for f in failures]
        text = text or "; ".join(f.describe() for f in failures)

        def change(state):
            if state.round != self.round or state.closed:
                return False
            state.lost += [n for n in lost if n not in state.lost]
            counts = why != "membership"
            if counts and state.restarts >= s.max_restarts:
                state.closed = [why, records, text]
            else:
                state.round += 1
                state.complete, state.nodes = False, []
                state.restarts += counts
                state.ended = [self.round, why, records, text]
            return True
        return self._ended(rdzv.shared.update(change))

    def _ended(self, state):
        try:
            if state.closed:
                why, records, text = state.closed
                return Ended(why, _failures(records), text, final=True)
            if state.round != self.round:
                if state.ended and state.ended[0] == self.round:
                    _, why, records, text = state.ended
                    return Ended(why, _failures(records), text, final=False)
                return Ended("restarted", [], "the round was restarted", final=False)
        except (TypeError, ValueError):
            raise RendezvousStateError("the rendezvous state's end of a round is malformed") \
                from None
        return None

    def finished(self):
        """This node's workers succeeded: wait (torchrun's exit barrier) until every node's
        did; None then, or :class:`Ended` if the round ended meanwhile (a node failed or
        was lost: the world restarts, these workers too)."""
        rdzv = self._rdzv
        key = f"round/{self.round}/done"
        rdzv.store.add(key, 1)
        deadline = time.monotonic() + _EXIT_BARRIER_TIMEOUT
        while int(rdzv.store.add(key, 0)) < len(self.nodes):
            ended = self.check(membership=False)
            if ended is not None and ended.why != "finished":
                return ended
            if ended is not None or time.monotonic() > deadline:
                break
            time.sleep(_POLL)
        rdzv.close("finished", [], "the job finished")
        return None

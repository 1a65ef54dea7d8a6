"""A graceful shutdown collects garbage (so that RRefs held only by reference cycles
release their forks before the barrier) only when an RRef of its agent is alive: a full
collection in every process at once, on a machine with fewer cores than processes, held
their GILs for seconds and starved the threads that answer the barrier."""
import gc

import pytest

from distgrad.distributed import rpc
from distgrad.rpc.current import current_agent

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def counted_collections(monkeypatch):
    """The full collections run from now on (each still runs)."""
    calls = []
    real = gc.collect

    def collect(*args):
        calls.append(args)
        return real(*args)

    monkeypatch.setattr(gc, "collect", collect)
    return calls


def _solo(tmp_path):
    options = rpc.TensorPipeRpcBackendOptions(init_method=f"file://{tmp_path / 'init'}")
    rpc.init_rpc("solo", rank=0, world_size=1, rpc_backend_options=options)
    return current_agent()


def test_the_agent_knows_which_of_its_rrefs_are_alive(tmp_path):
    agent = _solo(tmp_path)
    try:
        assert not agent.forks.alive
        r = rpc.RRef([1, 2])
        assert set(agent.forks.alive) == {r}
        del r
        assert not agent.forks.alive
    finally:
        rpc.shutdown()


def test_shutdown_collects_no_garbage_without_rrefs(tmp_path, counted_collections):
    _solo(tmp_path)
    rpc.shutdown()
    assert counted_collections == []


def test_shutdown_collects_an_rref_held_by_a_cycle(tmp_path, monkeypatch):
    agent = _solo(tmp_path)
    owned_after = []  # values this process owns, after each collection
    real = gc.collect
    monkeypatch.setattr(gc, "collect", lambda *a: (real(*a), owned_after.append(len(agent.owner))))
    gc.disable()  # the cycle stays until shutdown's collection
    try:
        r = rpc.RRef([3])
        cycle = [r]
        cycle.append(cycle)
        del r, cycle
        assert agent.forks.alive and len(agent.owner) == 1
        rpc.shutdown()
    finally:
        gc.enable()
    # one collection, and it released the fork: the value was freed before the barrier
    assert owned_after == [0]
    assert not agent.forks.alive

"""RRefs: remote objects, method proxies, passing RRefs around, lifetime."""
import gc
import time

import pytest

from distgrad.distributed import rpc
from support import rpc_funcs as f

pytestmark = pytest.mark.timeout(60)


def wait_for(cond, timeout=10.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.02)
    return cond()


def test_remote_object_and_proxies(rpc_world):
    rpc_world(2)
    r = rpc.remote("worker1", f.Counter, args=(10,))
    assert r.owner() == rpc.get_worker_info("worker1") and r.owner_name() == "worker1"
    assert not r.is_owner()
    assert r.rpc_sync().increment(5) == 15
    assert r.rpc_async().increment().wait() == 16
    r2 = r.remote().get()
    assert r2.to_here() == 16
    # the owner's confirmation travels apart from the calls' replies (as in PyTorch, where
    # it is asynchronous too): it comes, but not necessarily before them
    assert wait_for(r.confirmed_by_owner)
    with pytest.raises(RuntimeError, match="local_value"):
        r.local_value()
    assert rpc.rpc_sync("worker2", f.rref_increment, (r, 4)) == 20  # passed to a third worker
    assert rpc.rpc_sync("worker1", f.rref_to_here, (rpc.remote("worker1", f.add, (1, 2)),)) == 3
    local = rpc.RRef([1, 2])
    assert local.is_owner() and local.local_value() == [1, 2] and local.to_here() == [1, 2]
    assert rpc.rpc_sync("worker2", f.rref_to_here, (local,)) == [1, 2]
    bad = rpc.remote("worker2", f.raise_value_error, ("in remote",))
    with pytest.raises(ValueError, match="in remote"):
        bad.to_here()


def test_no_leak_after_many_remote_calls(rpc_world):
    rpc_world(1)
    for i in range(1000):
        r = rpc.remote("worker1", f.add, (i, 1))
        if i % 100 == 0:
            assert r.to_here() == i + 1
    del r
    gc.collect()
    assert wait_for(lambda: rpc.rpc_sync("worker1", f.rref_count) == 0), \
        rpc.rpc_sync("worker1", f.rref_count)


def test_value_lives_while_a_fork_is_alive(rpc_world):
    rpc_world(2)
    r = rpc.remote("worker1", f.echo, ([7],))
    assert rpc.rpc_sync("worker2", f.hold_rref, ("k", r)) == "worker1"
    del r
    gc.collect()
    time.sleep(0.3)
    assert rpc.rpc_sync("worker1", f.rref_count) == 1
    assert rpc.rpc_sync("worker2", f.held_to_here, ("k",)) == [7]
    rpc.rpc_sync("worker2", f.drop_rref, ("k",))
    assert wait_for(lambda: rpc.rpc_sync("worker1", f.rref_count) == 0)

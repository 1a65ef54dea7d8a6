"""The store as an RPC worker's role: one worker's memory holds another's activations."""
import time

import pytest

import distgrad

from distgrad.offload import OffloadPolicy, StoreError, save_on_remote

from offload_helpers import assert_bitwise_equal, gradients, make_mlp

pytestmark = pytest.mark.timeout(90)


def test_an_rpc_worker_serves_as_store(rpc_world):
    from distgrad.offload.rpc_store import RpcStore
    rpc_world(1, allowed_modules=["distgrad.offload.rpc_store"])   # the role is opt-in
    store = RpcStore("worker1", memory_bytes=1 << 20)
    want = gradients(make_mlp, retain_graph=True)
    hooks = save_on_remote(store, policy=OffloadPolicy(min_bytes=0))
    assert_bitwise_equal(gradients(make_mlp, hooks, retain_graph=True), want)
    assert hooks.stats.tensors_offloaded == 3
    # backward may finish before the store has even received the puts (reads are served
    # from the bytes still on their way): once they are stored, the deletes follow
    hooks.flush()
    deadline = time.monotonic() + 5
    while store.stats()["client_blobs"] and time.monotonic() < deadline:
        time.sleep(0.01)
    assert store.stats()["client_blobs"] == 0
    hooks.close()

    small = RpcStore("worker1", memory_bytes=100)       # refuses: memory only, no spill
    hooks = save_on_remote(small, policy=OffloadPolicy(min_bytes=0))
    with hooks:
        loss = make_mlp()(distgrad.randn(8, 32)).sum()
    hooks.flush()                                       # the refusals have come back
    with pytest.raises(StoreError, match="worker1.*full"):
        loss.backward()
    hooks.close()

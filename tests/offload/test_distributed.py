"""Offloading in a distributed pass: each worker offloads its own segment, set per context by
the coordinator; gradients are unchanged and nothing is left when the context is released."""
import numpy as np
import pytest

import distgrad
from distgrad.distributed import autograd as dist_autograd
from distgrad.distributed import rpc
from support import dist_funcs as f

pytestmark = pytest.mark.timeout(90)

SHAPES = [(16, 32), (32,), (32, 32), (32,), (32, 32), (32,)]
ALLOW = ["distgrad.offload.distributed"]


def _step(key, offload):
    from distgrad.offload.distributed import register_offload
    x = distgrad.tensor(np.random.default_rng(0).standard_normal((8, 16)), requires_grad=True)
    with dist_autograd.context() as cid:
        if offload is not None:
            register_offload(cid, offload, workers=["worker1"])
        loss = (rpc.rpc_sync("worker1", f.stage, (key, x)) ** 2).sum()
        stats = rpc.rpc_sync("worker1", f.offload_stats, (cid,))
        files = rpc.rpc_sync("worker1", f.run_dirs)
        dist_autograd.backward(cid, [loss])
        grads = rpc.rpc_sync("worker1", f.grads_of, (cid, key))
        after = rpc.rpc_sync("worker1", f.offload_stats, (cid,))
    return grads, stats, files, after


@pytest.mark.parametrize("config", [
    {"kind": "disk", "policy": {"min_bytes": 0}},
    {"kind": "tiered", "memory_bytes": 2048, "policy": {"min_bytes": 0}},
])
def test_a_worker_offloads_its_segment_bit_for_bit(rpc_world, config):
    rpc_world(1, allowed_modules=ALLOW)
    rpc.rpc_sync("worker1", f.make_params, ("off", 5, SHAPES))
    plain, none, _, _ = _step("off", None)
    assert none is None
    grads, before, files, after = _step("off", config)
    for g, want in zip(grads, plain):
        np.testing.assert_array_equal(g, want)  # bit for bit
    assert before["offloaded"] > 0 and (files or config["kind"] == "tiered")
    assert after["hits"] + after["misses"] > 0  # backward read the offloaded records back
    assert rpc.rpc_sync("worker1", f.run_dirs) == []  # released with the context


def test_workers_must_allow_offloading_explicitly(rpc_world):
    rpc_world(1)
    from distgrad.offload.distributed import register_offload
    with dist_autograd.context() as cid:
        with pytest.raises(rpc.RefusedCallError, match="distgrad.offload.distributed"):
            register_offload(cid, {"kind": "disk"}, workers=["worker1"])
    with pytest.raises(ValueError, match="unknown key 'bogus'"):
        register_offload(1, {"kind": "disk", "bogus": 1})

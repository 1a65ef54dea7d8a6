"""Checkpointing under distributed autograd: a checkpointed segment whose forward makes
an RPC makes it again when backward recomputes the segment (on the coordinator, or on a
worker inside its part of the distributed pass); gradients equal those without
checkpointing, bit for bit. The reentrant form refuses clearly instead of putting
gradients where the distributed context does not see them."""
import numpy as np
import pytest

pytest.importorskip("zmq")
pytest.importorskip("msgpack")

import distgrad  # noqa: E402
from distgrad.distributed import autograd as dist_autograd  # noqa: E402
from distgrad.distributed import rpc  # noqa: E402
from distgrad.utils.checkpoint import checkpoint  # noqa: E402
from support import checkpoint_funcs as cf, dist_funcs as f  # noqa: E402

pytestmark = pytest.mark.timeout(60)
SHAPES = [(4, 4), (4,)]


def _x():
    return distgrad.tensor(np.random.default_rng(0).standard_normal((3, 4)), requires_grad=True)


def _bit_equal(runs):
    (a, b) = runs
    assert len(a) == len(b)
    for g, w in zip(a, b):
        assert g is not None and (g == w).all()


def test_a_coordinator_segment_reruns_its_rpc_in_backward(rpc_world):
    rpc_world(2)
    rpc.rpc_sync("worker1", f.make_params, ("r", 1, SHAPES))
    f.make_params("l", 2, SHAPES)
    runs = []
    for checkpointed in (False, True):
        before = rpc.rpc_sync("worker1", cf.calls)
        x = _x()
        with dist_autograd.context() as cid:
            args = (x, "worker1", "r", "l")
            y = checkpoint(cf.remote_then_local, *args, use_reentrant=False) if checkpointed \
                else cf.remote_then_local(*args)
            dist_autograd.backward(cid, [y.sum()])
            g = dist_autograd.get_gradients(cid)
            runs.append([g[x].numpy()] + [g[p].numpy() for p in f.params("l")]
                        + rpc.rpc_sync("worker1", f.grads_of, (cid, "r")))
        # the remote stage ran once in forward, and once more in the recomputation
        assert rpc.rpc_sync("worker1", cf.calls) - before == (2 if checkpointed else 1)
    _bit_equal(runs)


def test_a_worker_segment_reruns_its_nested_rpc_inside_the_distributed_pass(rpc_world):
    rpc_world(3)
    rpc.rpc_sync("worker2", f.make_params, ("r", 1, SHAPES))
    rpc.rpc_sync("worker1", f.make_params, ("l", 2, SHAPES))
    runs = []
    for fn in (cf.remote_then_local, cf.checkpointed_remote_then_local):
        x = _x()
        with dist_autograd.context() as cid:
            y = rpc.rpc_sync("worker1", fn, (x, "worker2", "r", "l"))
            dist_autograd.backward(cid, [y.sum()])
            g = dist_autograd.get_gradients(cid)
            runs.append([g[x].numpy()] + rpc.rpc_sync("worker1", f.grads_of, (cid, "l"))
                        + rpc.rpc_sync("worker2", f.grads_of, (cid, "r")))
    assert rpc.rpc_sync("worker2", cf.calls) == 3
    _bit_equal(runs)


def test_the_reentrant_form_refuses_a_distributed_backward(rpc_world):
    rpc_world(2)
    rpc.rpc_sync("worker1", f.make_params, ("r", 1, SHAPES))
    f.make_params("l", 2, SHAPES)
    x = _x()
    with dist_autograd.context() as cid:
        y = rpc.rpc_sync("worker1", f.stage, ("r", x))
        z = checkpoint(f.stage, "l", y, use_reentrant=True)
        with pytest.raises(RuntimeError, match="use_reentrant=True cannot recompute inside a "
                                               "distributed autograd backward"):
            dist_autograd.backward(cid, [z.sum()])

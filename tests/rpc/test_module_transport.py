"""An ``nn.Module`` and an optimizer's state_dict travel over RPC by value (no pickle):
the receiver rebuilds the module from its class reference, resolved by its allowlist."""
import sys
import types

import numpy as np
import pytest

import distgrad
from distgrad.distributed import rpc
from support import nn_funcs

pytestmark = pytest.mark.timeout(60)


class NotAllowedOnWorkers(distgrad.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = distgrad.nn.Linear(2, 2)


# The harness trusts this test module on its workers; a class of a module that no
# worker allows is what a program would send by mistake.
_unlisted = types.ModuleType("unlisted_models")
_unlisted.NotAllowedOnWorkers = NotAllowedOnWorkers
NotAllowedOnWorkers.__module__ = "unlisted_models"
sys.modules.setdefault("unlisted_models", _unlisted)


def test_a_module_and_its_optimizer_state_go_and_come_back(rpc_world):
    rpc_world(2)
    distgrad.manual_seed(0)
    model = nn_funcs.TwoLayer()
    sent = nn_funcs.TwoLayer()
    sent.load_state_dict(model.state_dict())
    x = distgrad.randn(5, 3)
    # the same two steps here and on the workers, the optimizer's state passed along
    local, state, _ = nn_funcs.train_step(model, None, x)
    local, state, loss = nn_funcs.train_step(local, state, x)
    remote, remote_state, _ = rpc.rpc_sync("worker1", nn_funcs.train_step, (sent, None, x))
    remote, remote_state, remote_loss = rpc.rpc_sync("worker2", nn_funcs.train_step,
                                                     (remote, remote_state, x))
    assert type(remote) is nn_funcs.TwoLayer and remote.act is distgrad.nn.functional.relu
    assert remote_loss == pytest.approx(loss, rel=1e-6)
    ours, theirs = local.state_dict(), remote.state_dict()
    assert list(ours) == list(theirs)
    for k in ours:  # weights, BatchNorm's running statistics and counter
        np.testing.assert_allclose(theirs[k].numpy(), ours[k].numpy(), rtol=1e-6, err_msg=k)
    for i, s in state["state"].items():
        for k, v in s.items():
            np.testing.assert_allclose(np.asarray(remote_state["state"][i][k]), np.asarray(v),
                                       rtol=1e-6, err_msg=f"{i}.{k}")
    assert remote_state["param_groups"] == state["param_groups"]


def test_a_module_class_outside_the_workers_allowlist_is_refused(rpc_world):
    rpc_world(2)
    with pytest.raises(RuntimeError, match="NotAllowedOnWorkers.*refused"):
        rpc.rpc_sync("worker1", nn_funcs.train_step, (NotAllowedOnWorkers(), None,
                                                       distgrad.ones(1, 2)))

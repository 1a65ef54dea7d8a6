"""``rpc._set_rpc_timeout``: the default timeout of a process's later RPCs, as PyTorch's."""
import pytest

from distgrad.distributed import rpc
from support import rpc_funcs as f

pytestmark = pytest.mark.timeout(60)


def test_set_rpc_timeout_changes_the_default_of_later_calls(rpc_world):
    rpc_world(1, rpc_timeout=60)
    assert rpc._get_rpc_timeout() == 60
    rpc._set_rpc_timeout(0.2)
    assert rpc._get_rpc_timeout() == 0.2
    with pytest.raises(rpc.RpcTimeoutError, match="RPC ran for more than set timeout"):
        rpc.rpc_sync("worker1", f.sleep_and_return, (2.0,))
    with pytest.raises(rpc.RpcTimeoutError):
        rpc.rpc_async("worker1", f.sleep_and_return, (2.0,)).wait()
    # a call given its own timeout keeps it
    assert rpc.rpc_sync("worker1", f.sleep_and_return, (0.4, "late"), timeout=30) == "late"
    rpc._set_rpc_timeout(0)  # no timeout
    assert rpc.rpc_sync("worker1", f.sleep_and_return, (0.4, "ok")) == "ok"


def test_set_rpc_timeout_refuses_nonsense_and_needs_rpc(rpc_world):
    with pytest.raises(RuntimeError, match="init_rpc"):
        rpc._set_rpc_timeout(5)
    rpc_world(1)
    for bad in (-1, "5", True):
        with pytest.raises(ValueError, match="timeout"):
            rpc._set_rpc_timeout(bad)


def test_the_agent_keeps_its_own_copy_of_the_options():
    from distgrad.rpc.agent import Agent
    mine = rpc.RpcBackendOptions(rpc_timeout=7)
    agent = Agent("solo", 0, 1, mine)
    assert agent.options is not mine and agent.options.rpc_timeout == 7
    agent.options.rpc_timeout = 3  # as _set_rpc_timeout does: the agent's parts see it
    assert mine.rpc_timeout == 7

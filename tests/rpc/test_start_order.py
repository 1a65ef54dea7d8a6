"""An agent is the process's current agent before a peer's first call can run on it (the
example programs of tests/integration met that race: a remote ``Observer()`` calling
``rpc.get_worker_info()`` on a worker still finishing ``init_rpc``)."""
import pytest

from distgrad.distributed import rpc
from distgrad.rpc import agent as agent_module
from distgrad.rpc.current import current_agent

pytestmark = pytest.mark.timeout(60)


def test_init_rpc_makes_the_agent_current_before_it_starts_serving(monkeypatch):
    # a handler that calls rpc.get_worker_info() may run as soon as the I/O thread starts
    seen = []
    start = agent_module.Agent.start

    def observed_start(self, *args, **kwargs):
        seen.append(current_agent() is self)
        start(self, *args, **kwargs)
        seen.append(self.running)
    monkeypatch.setattr(agent_module.Agent, "start", observed_start)
    rpc.init_rpc("solo", rank=0, world_size=1,
                 rpc_backend_options=rpc.RpcBackendOptions(init_method="tcp://127.0.0.1:0"))
    try:
        assert seen == [True, True]
        assert rpc.get_worker_info().name == "solo"
    finally:
        rpc.shutdown()
    assert current_agent() is None

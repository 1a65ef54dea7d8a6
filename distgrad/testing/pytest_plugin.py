"""pytest plugin (entry point ``pytest11: distgrad``): the ``rpc_world`` fixture.

Loaded in every pytest run, so it imports nothing heavy until the fixture is used.

    def test_add(rpc_world):
        world = rpc_world(2, transport="ipc")      # this process is "worker0" (rank 0)
        from distgrad.distributed import rpc
        assert rpc.rpc_sync("worker1", operator.add, (1, 2)) == 3

Workers are separate processes (``python -m distgrad worker``) named ``worker1`` ..
``workerN``; the test process joins as ``worker0``. Endpoints are ipc:// paths in a
fresh temp dir or tcp port 0, so ``pytest -n auto`` is safe. At teardown the world
shuts down gracefully, then every child is killed after a grace period and
reaped; the workers' logs are printed when the test failed.
"""
import pytest


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    rep = outcome.get_result()
    setattr(item, f"_distgrad_rep_{rep.when}", rep)


@pytest.fixture
def rpc_world(request):
    """Factory: ``rpc_world(n, transport="ipc"|"tcp", **options)`` -> World."""
    from distgrad.testing.world import World
    worlds = []

    def start(n=2, transport="ipc", **kwargs):
        w = World(n, transport=transport, **kwargs)
        worlds.append(w)
        w.start()
        return w
    yield start
    rep = getattr(request.node, "_distgrad_rep_call", None)
    failed = rep is None or rep.failed
    for w in reversed(worlds):
        w.close(show_logs=failed)

"""A World's workers: forked from a preloaded server (spawned when the environment must be
seen at import time), in the test's working directory, running only what the world allows."""
import os

import pytest

from distgrad.distributed import rpc
from distgrad.rpc.allowlist import Allowlist
from distgrad.rpc.errors import RefusedCallError
from distgrad.testing import forkserver, leaks
from distgrad.testing.world import World

pytestmark = pytest.mark.timeout(60)


def env(name):
    return os.environ.get(name)


def cwd():
    return os.getcwd()


def test_workers_are_forked_and_see_the_test_directory_and_runtime_variables(rpc_world):
    world = rpc_world(1, worker_env={"DISTGRAD_EXAMPLE": "yes"})
    assert world.start_method == "fork"
    assert rpc.rpc_sync("worker1", env, ("DISTGRAD_EXAMPLE",)) == "yes"
    assert rpc.rpc_sync("worker1", cwd) == os.getcwd()


def test_variables_read_at_import_time_make_workers_spawn(rpc_world):
    world = rpc_world(1, worker_env={"OMP_NUM_THREADS": "1"})
    assert world.start_method == "spawn"
    assert rpc.rpc_sync("worker1", env, ("OMP_NUM_THREADS",)) == "1"


def test_only_allowed_modules_and_the_test_module_run_on_workers(rpc_world):
    rpc_world(1)
    assert rpc.rpc_sync("worker1", env, ("HOME",)) == os.environ.get("HOME")  # this module
    with pytest.raises(RefusedCallError, match="'json' is not on this worker's allowlist"):
        rpc.rpc_sync("worker1", "json:dumps", ([1],))
    # the harness's helpers run on a World's workers, and nowhere by default
    with pytest.raises(RefusedCallError, match="'distgrad.testing.remote' is not on"):
        Allowlist([]).resolve("distgrad.testing.remote:state")


def test_closing_reaps_every_worker_also_one_that_died():
    world = World(2).start()
    try:
        world.procs["worker2"].kill()
    finally:
        world.close()
    assert all(p.returncode is not None for p in world.procs.values())
    server = forkserver.running_server()
    assert server is not None and leaks.children(server.pid) == {}
    assert not os.path.exists(world.dir)

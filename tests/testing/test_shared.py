"""Worlds shared by a module: reused while each test leaves them as it found them."""
import pytest

pytestmark = pytest.mark.timeout(120)

SHARED = '''
import os, threading, time
import pytest
from distgrad.distributed import rpc

PIDS = []

def pid():
    return os.getpid()

def start_thread():
    threading.Thread(target=time.sleep, args=(5,), name="leftover", daemon=True).start()

def test_first(rpc_world):
    rpc_world(2, scope="module")
    PIDS.append(rpc.rpc_sync("worker1", pid))

def test_reuses_the_world(rpc_world):
    world = rpc_world(2, scope="module")
    assert rpc.rpc_sync("worker1", pid) == PIDS[0] == world.procs["worker1"].pid
    world.faults.drop(fn=pid)   # removed when the test ends

def test_faults_do_not_outlive_a_test(rpc_world):
    rpc_world(2, scope="module")
    assert rpc.rpc_sync("worker1", pid, timeout=5) == PIDS[0]

def test_leaves_a_thread(rpc_world):
    rpc_world(2, scope="module")
    rpc.rpc_sync("worker1", start_thread)

def test_gets_a_new_world(rpc_world):
    rpc_world(2, scope="module")
    PIDS.append(rpc.rpc_sync("worker1", pid))
    assert PIDS[-1] != PIDS[0]

def test_kills_a_worker(rpc_world):
    rpc_world(2, scope="module").kill("worker2")

@pytest.mark.world(2, scope="module")
def test_spmd_in_a_shared_world(rank):
    if rank == 0:
        PIDS.append(rpc.rpc_sync("worker1", pid))

@pytest.mark.world(2, scope="module")
def test_spmd_again(rank):
    if rank == 0:
        assert rpc.rpc_sync("worker1", pid) == PIDS[-1]
'''


def test_a_module_world_is_shared_and_checked_after_each_test(example):
    result = example(SHARED, "-rA")
    result.assert_outcomes(passed=8, errors=2)
    result.stdout.fnmatch_lines_random([
        "ERROR test_example.py::test_leaves_a_thread - Failed: distgrad: the test left*",
        "ERROR test_example.py::test_kills_a_worker - Failed: distgrad: the test left*",
        "*- worker1: thread 'leftover' is still running",
        "*- the shared world was replaced by a new one",
        "*- worker2 is dead (killed)",
    ])

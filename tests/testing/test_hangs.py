"""A test that times out: every rank's stacks and pending calls are in its report, taken
before the world is killed (pytest-timeout's signal method fails the test; its thread
method ends the process, so the report is printed before)."""
import pytest

pytestmark = pytest.mark.timeout(120)
pytest.importorskip("pytest_timeout")

HANGING = '''
import time
import pytest
from distgrad.distributed import rpc

def block_forever():
    while True:
        time.sleep(0.05)

@pytest.fixture
def world(rpc_world):
    return rpc_world(2)

@pytest.mark.timeout(3, method="{method}", func_only=True)   # the world is up before
def test_hangs_in_a_worker(world):
    rpc.rpc_sync("worker1", block_forever)
'''


@pytest.mark.parametrize("method", ["signal", "thread"])
def test_a_timeout_shows_the_stacks_and_pending_calls_of_every_rank(example_subprocess, method):
    result = example_subprocess(HANGING.format(method=method))
    result.stdout.fnmatch_lines([
        "*distgrad: stacks and pending calls of every rank*",
        "*- rank 0 (worker0, pid *, the test process) -*",
        "pending calls: 1 x test_example:block_forever to rank 1",
        "Thread 'MainThread' (most recent call last):",
        "*in test_hangs_in_a_worker*",
        "*- rank 1 (worker1, pid *) -*",
        "Thread 0x* rpc-worker1-*",
        "*in block_forever*",
        "pending calls of worker1: *",
        "*- rank 2 (worker2, pid *) -*",
        "Current thread 0x* MainThread*",
    ])
    if method == "signal":
        result.assert_outcomes(failed=1)
        result.stdout.fnmatch_lines(["*Failed: Timeout*"])

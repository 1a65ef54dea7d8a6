"""Leak checks: whatever a passing test leaves behind on any rank fails it, named."""
import glob
import os
import re
import tempfile
import time

import pytest

pytestmark = pytest.mark.timeout(120)

LEAKY = '''
import os, subprocess, sys, tempfile, threading, time
import pytest
from distgrad.distributed import rpc
import distgrad.distributed.autograd as dist_autograd
from distgrad.rpc import interceptors

KEEP = []

def start_thread():
    threading.Thread(target=time.sleep, args=(5,), name="leaky-thread", daemon=True).start()

def start_child():  # (its sleep outlives a test on a loaded machine: the check kills it)
    KEEP.append(subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"]))

def open_file(path):
    KEEP.append(open(path, "w"))

def enter_context():
    dist_autograd.context().__enter__()

def make_temp_file():   # named as distgrad names what a process owns, by no sweeper's prefix
    os.close(tempfile.mkstemp(prefix=f"dg-scratch-{os.getpid()}-")[0])

def make_list():
    return [1, 2]

def snooze():
    time.sleep(30)

def test_thread_on_a_worker(rpc_world):
    rpc_world(1)
    rpc.rpc_sync("worker1", start_thread)

def test_child_process_on_a_worker(rpc_world):
    rpc_world(1)
    rpc.rpc_sync("worker1", start_child)

def test_file_on_a_worker(rpc_world, tmp_path):
    rpc_world(1)
    rpc.rpc_sync("worker1", open_file, (str(tmp_path / "f.txt"),))

def test_autograd_context_on_a_worker(rpc_world):
    rpc_world(1)
    rpc.rpc_sync("worker1", enter_context)

def test_temp_file_of_a_worker(rpc_world):
    rpc_world(1)
    rpc.rpc_sync("worker1", make_temp_file)

def test_rref_kept_alive(rpc_world):
    rpc_world(2)
    KEEP.append(rpc.remote("worker2", make_list))

def test_call_never_waited_for(rpc_world):
    rpc_world(1)
    rpc.rpc_async("worker1", snooze)

def test_thread_in_the_test_process(rpc_world):
    rpc_world(1)
    threading.Thread(target=time.sleep, args=(5,), name="local-leaky", daemon=True).start()

def test_child_and_file_in_the_test_process(rpc_world, tmp_path):
    rpc_world(1)
    KEEP.append(subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"]))
    KEEP.append(open(tmp_path / "g.txt", "w"))

class Spy:
    pass

def test_interceptor_left_installed(rpc_world):
    rpc_world(1)
    interceptors.add(Spy())

@pytest.mark.no_leak_check
def test_opted_out_by_marker(rpc_world):
    rpc_world(1)
    rpc.rpc_sync("worker1", start_thread)

def test_opted_out_by_argument(rpc_world):
    rpc_world(1, leak_check=False)
    rpc.rpc_sync("worker1", start_thread)

@pytest.mark.world(2)
def test_spmd_leak(rank):
    if rank == 1:
        start_thread()

def test_failing_test_is_not_checked(rpc_world):
    rpc_world(1)
    rpc.rpc_sync("worker1", start_thread)
    assert False, "the real failure"
'''


def test_each_kind_of_leak_fails_the_test_naming_it(example):
    t0 = time.monotonic()
    result = example(LEAKY, "-rA", "--timeout=60", ini="timeout = 60\n")
    result.assert_outcomes(passed=13, errors=11, failed=1)
    errors = {line.split("::")[1].split(" ")[0]: line
              for line in result.stdout.lines if line.startswith("ERROR test_example.py::")}
    assert sorted(errors) == sorted([
        "test_thread_on_a_worker", "test_child_process_on_a_worker", "test_file_on_a_worker",
        "test_autograd_context_on_a_worker", "test_temp_file_of_a_worker",
        "test_rref_kept_alive", "test_call_never_waited_for", "test_thread_in_the_test_process",
        "test_child_and_file_in_the_test_process", "test_interceptor_left_installed",
        "test_spmd_leak"])
    result.stdout.fnmatch_lines_random([
        "*- worker1: thread 'leaky-thread' is still running",
        "*- worker1: child process * (*python* -c import time; time.sleep(300)) is still there "
        "(killed now)",
        "*- worker1: file descriptor * (*/f.txt) is still open",
        "*- worker1: distributed autograd context(s) * are still alive",
        "*- worker1: */dg-scratch-*-* was left behind (removed now)",
        "*- worker2: still owns 1 RRef value(s)*",
        "*- worker0: still waits for 1 call(s): 1 x test_example:snooze to rank 1",
        "*- the test process: thread 'local-leaky' is still running",
        "*- the test process: child process * is still there (killed now)",
        "*- the test process: file descriptor * (*/g.txt) is still open",
        "*- the test process: RPC interceptor 'Spy' is still installed",
        "*the test left things behind (mark the test no_leak_check*",
    ])
    assert "the real failure" in result.stdout.str()
    # nothing survives: the leaked children were killed, the leaked file removed
    pids = re.findall(r"worker1: \S*/dg-scratch-(\d+)-", result.stdout.str())
    assert pids and not glob.glob(os.path.join(tempfile.gettempdir(), f"dg-scratch-{pids[0]}-*"))
    assert time.monotonic() - t0 < 60

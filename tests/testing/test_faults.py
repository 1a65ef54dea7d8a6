"""Fault injection for users' tests: kill, pause and resume a worker; delay, drop, duplicate
or fail the nth message that matches, deterministically. The functions the ranks run are
this module's own (a world trusts its test module)."""
import time

import pytest

from distgrad.distributed import rpc
from distgrad.testing.world import _stopped

pytestmark = pytest.mark.timeout(60)

RAN = []  # on each worker: what ran there


def record(tag):
    RAN.append(tag)
    return tag


def ran():
    return list(RAN)


def forget():
    RAN.clear()


def relay(dst, tag):
    return rpc.rpc_sync(dst, record, (tag,), timeout=0.5)


@pytest.fixture
def world(rpc_world):
    w = rpc_world(2, scope="module")
    for name in ("worker1", "worker2"):
        rpc.rpc_sync(name, forget)
    return w


def ran_on(name, expected_len, timeout=5.0):
    deadline = time.monotonic() + timeout
    while len(got := rpc.rpc_sync(name, ran)) < expected_len and time.monotonic() < deadline:
        time.sleep(0.01)
    return got


def test_drop_the_nth_matching_request(world):
    rule = world.faults.drop(fn=record, dst="worker1", nth=2)
    assert rpc.rpc_sync("worker1", record, ("a",)) == "a"
    with pytest.raises(rpc.RpcTimeoutError, match="record"):
        rpc.rpc_sync("worker1", record, ("b",), timeout=0.5)
    assert rpc.rpc_async("worker1", record, ("c",)).wait() == "c"
    assert rpc.rpc_sync("worker2", record, ("x",)) == "x"       # another destination
    assert rpc.rpc_sync("worker1", ran) == ["a", "c"] and rule.fired() == 1


def test_drop_a_response_after_the_work_was_done(world):
    world.faults.drop(fn="*:record", kind="response")
    with pytest.raises(rpc.RpcTimeoutError):
        rpc.rpc_async("worker1", record, ("done",), timeout=0.5).wait()
    assert ran_on("worker1", 1) == ["done"]    # on a loaded machine it may run after 0.5 s


def test_duplicate_runs_the_call_twice(world):
    world.faults.duplicate(fn=record, nth=1)
    assert rpc.rpc_sync("worker1", record, ("d",)) == "d"
    assert rpc.rpc_async("worker1", record, ("e",)).wait() == "e"
    # the copies are served like any two requests, by the handler pool: the second "d"
    # may run after "e"
    assert sorted(ran_on("worker1", 3)) == ["d", "d", "e"]
    world.faults.duplicate(fn=record, kind="response")   # the second reply is dropped as late
    assert [rpc.rpc_sync("worker2", record, (t,)) for t in "fg"] == ["f", "g"]


def test_delay_holds_matching_messages_only(world):
    world.faults.delay(1.0, fn=record, kind="response")
    t0 = time.monotonic()
    assert rpc.rpc_sync("worker1", record, ("slow",)) == "slow"
    t1 = time.monotonic()
    rpc.rpc_sync("worker1", ran)
    assert t1 - t0 >= 1.0 and time.monotonic() - t1 < 0.5


def test_fail_a_request_or_a_response(world):
    world.faults.fail(fn=record, dst="worker1", error=ConnectionError, message="link down")
    with pytest.raises(ConnectionError, match="injected fault: link down"):
        rpc.rpc_sync("worker1", record, ("never",))
    with pytest.raises(ConnectionError, match="request test_faults:record to worker1"):
        rpc.rpc_async("worker1", record, ("never",)).wait()
    # a response goes from the callee to the caller: its rule lives where it is sent (src)
    world.faults.fail(fn=record, src="worker2", kind="response", error=ValueError)
    with pytest.raises(ValueError, match="injected fault"):
        rpc.rpc_sync("worker2", record, ("ran",))
    assert rpc.rpc_sync("worker1", ran) == [] and rpc.rpc_sync("worker2", ran) == ["ran"]


def test_a_rule_applies_where_its_src_sends(world):
    world.faults.drop(src="worker1", dst="worker2", fn=record)
    with pytest.raises(rpc.RpcTimeoutError, match="worker2"):
        rpc.rpc_sync("worker1", relay, ("worker2", "lost"))
    assert rpc.rpc_sync("worker2", record, ("direct",)) == "direct"  # from rank 0: untouched
    assert rpc.rpc_sync("worker2", ran) == ["direct"]


def _pattern(world, seed):
    rule = world.faults.fail(fn=record, p=0.5, seed=seed)
    out = ""
    for i in range(24):
        try:
            rpc.rpc_sync("worker1", record, (i,))
            out += "."
        except RuntimeError:
            out += "x"
    rule.remove()
    return out


def test_random_faults_repeat_with_their_seed(world):
    first, again, other = _pattern(world, 7), _pattern(world, 7), _pattern(world, 8)
    assert first == again and "x" in first and "." in first and other != first


def test_the_harness_own_calls_are_never_faulted(world):
    rule = world.faults.drop()            # every message of every function
    with pytest.raises(rpc.RpcTimeoutError):
        rpc.rpc_sync("worker1", ran, timeout=0.3)
    assert rule.fired() >= 1              # counted over RPC: not dropped


def test_rules_are_checked_where_they_are_made(world):
    with pytest.raises(ValueError, match="kind='sideways'"):
        world.faults.drop(kind="sideways")
    with pytest.raises(ValueError, match="dst='worker9'"):
        world.faults.drop(dst="worker9")
    with pytest.raises(ValueError, match="nth=0"):
        world.faults.drop(nth=0)
    with pytest.raises(TypeError, match="built-in exception or one of distgrad.rpc's errors"):
        world.faults.fail(error=type("MyError", (Exception,), {}))
    with pytest.raises(TypeError, match="lambdas"):
        world.faults.drop(fn=lambda: None)


def test_kill_pause_and_resume_a_worker(rpc_world):
    world = rpc_world(2)
    world.pause("worker2")
    assert _stopped(world.procs["worker2"].pid)  # every thread, by the time pause returns
    with pytest.raises(rpc.RpcTimeoutError):
        rpc.rpc_sync("worker2", record, ("paused",), timeout=0.5)
    world.resume("worker2")
    assert rpc.rpc_sync("worker2", record, ("resumed",)) == "resumed"
    world.kill("worker1")
    with pytest.raises(rpc.WorkerUnreachableError, match="worker1"):
        rpc.rpc_sync("worker1", record, ("dead",))
    # held, then served; two requests served by the pool at once finish in either order
    assert sorted(rpc.rpc_sync("worker2", ran)) == ["paused", "resumed"]

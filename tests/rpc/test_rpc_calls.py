"""Multi-process RPC: calls, errors, nesting and concurrency over ipc:// and tcp://."""
import operator
import threading
import time

import numpy as np
import pytest

from distgrad.distributed import rpc
from support import rpc_funcs as f

pytestmark = pytest.mark.timeout(60)


@pytest.fixture(params=["ipc", "tcp"])
def world(request, rpc_world):
    return rpc_world(2, transport=request.param)


def test_sync_async_and_worker_info(world):
    assert rpc.rpc_sync("worker1", operator.add, args=(2, 3)) == 5
    assert rpc.rpc_sync(rpc.get_worker_info("worker2"), f.echo, ((1, [2]),)) == (1, [2])
    assert rpc.rpc_sync(2, f.add, kwargs={"a": "x", "b": "y"}) == "xy"
    fut = rpc.rpc_async("worker2", f.add, args=(1, 1))
    assert fut.then(lambda x: x.value() + 1).wait() == 3 and fut.done() and fut.value() == 2
    assert rpc.get_worker_info() == rpc.WorkerInfo("worker0", 0)
    assert rpc.get_worker_info("worker1").id == 1
    assert rpc.rpc_sync("worker0", f.add, (1, 2)) == 3  # to oneself
    pids = {rpc.rpc_sync(w, f.pid) for w in ("worker1", "worker2")}
    assert len(pids) == 2


def test_arrays_round_trip_read_only_on_the_worker(world):
    a = np.random.default_rng(0).standard_normal((64, 33)).astype(np.float32)
    b = rpc.rpc_sync("worker1", f.echo, (a,))
    np.testing.assert_array_equal(a, b)
    assert not b.flags.writeable
    assert rpc.rpc_sync("worker1", f.try_inplace, (a,)) == "read-only"
    big = rpc.rpc_sync("worker2", f.make_array, (1 << 20, 2.0))
    assert big.shape == (1 << 20,) and float(big.sum()) == 2.0 * (1 << 20)


def test_remote_errors_keep_builtin_class_and_traceback(world):
    with pytest.raises(KeyError) as e:
        rpc.rpc_sync("worker1", f.raise_key_error, ("missing",))
    msg = e.value.args[0]
    assert "Remote traceback (on worker 'worker1')" in msg and "raise_key_error" in msg
    with pytest.raises(ValueError, match="boom"):
        rpc.rpc_async("worker2", f.raise_value_error, ("boom",)).wait()
    with pytest.raises(rpc.RemoteError, match="CustomError: custom"):
        rpc.rpc_sync("worker1", f.raise_custom, ("custom",))
    with pytest.raises(TypeError, match="cannot be sent"):  # unsendable return value
        rpc.rpc_sync("worker1", f.return_unsendable)
    with pytest.raises(TypeError, match="cannot be sent"):     # unsendable argument
        rpc.rpc_sync("worker1", f.echo, (threading.Lock(),))
    with pytest.raises(PermissionError, match="allowlist"):
        rpc.rpc_sync("worker1", "json:dumps", ([1],))
    with pytest.raises(TypeError, match="module-level"):
        rpc.rpc_sync("worker1", lambda: 1)
    assert rpc.rpc_sync("worker1", f.add, (1, 2)) == 3  # still serving


def test_errors_a_torch_program_catches_as_runtime_error(world):
    """PyTorch raises RuntimeError where these fail; each is also its own class."""
    cases = [(ValueError, lambda: rpc.rpc_sync("worker1", f.raise_value_error, ("boom",))),
             (KeyError, lambda: rpc.rpc_async("worker2", f.raise_key_error, ("k",)).wait()),
             (ValueError, lambda: rpc.rpc_sync("nobody", f.add, (1, 2))),
             (TypeError, lambda: rpc.rpc_sync("worker1", f.echo, (threading.Lock(),))),
             (TypeError, lambda: rpc.rpc_sync("worker1", f.return_unsendable)),
             (PermissionError, lambda: rpc.rpc_sync("worker1", "json:dumps", ([1],)))]
    for cls, call in cases:
        with pytest.raises(RuntimeError) as e:
            call()
        assert isinstance(e.value, cls), (cls, e.value)
    with pytest.raises(RuntimeError, match="Remote traceback \\(on worker 'worker1'\\)"):
        rpc.rpc_sync("worker1", f.raise_value_error, ("boom",))
    with pytest.raises(rpc.RemoteError) as e:
        rpc.rpc_sync("worker1", f.raise_custom, ("custom",))
    assert e.value.worker == "worker1" and e.value.remote_type.endswith("CustomError")


def test_nested_calls_bounce_between_workers(world):
    trail = rpc.rpc_sync("worker1", f.ping_pong, (["worker1", "worker2", "worker0"], 9))
    assert trail == ["worker1", "worker2", "worker0"] * 3 + ["worker1"]
    # many concurrent nested chains: the handler pools must not starve
    futs = [rpc.rpc_async("worker1", f.ping_pong, (["worker1", "worker2"], 6)) for _ in range(40)]
    assert all(len(x.wait()) == 7 for x in futs)


def test_a_function_marked_receives_caller_is_told_who_calls_it(world):
    assert rpc.rpc_sync("worker1", f.who_calls) == "worker0"
    assert rpc.rpc_sync("worker1", f.nested_call, ("worker2", f.who_calls)) == "worker1"
    assert rpc.rpc_async("worker2", f.who_calls).wait() == "worker0"
    # the callee says who calls: a caller that names one is refused, not believed
    with pytest.raises(RuntimeError, match="may not name its caller"):
        rpc.rpc_sync("worker1", f.who_calls, kwargs={"caller": "worker2"})


def test_many_threads_call_at_once(world):
    errors, results = [], []

    def client(k):
        try:
            for i in range(30):
                results.append(rpc.rpc_sync(f"worker{1 + (i + k) % 2}", f.add, (k, i)) == k + i)
        except Exception as e:  # noqa: BLE001
            errors.append(e)
    ts = [threading.Thread(target=client, args=(k,)) for k in range(12)]
    [t.start() for t in ts]
    [t.join(30) for t in ts]
    assert not errors and len(results) == 360 and all(results)


def test_a_slow_call_does_not_block_others(world):
    slow = rpc.rpc_async("worker1", f.sleep_and_return, (2.0, "slow"))
    t0 = time.monotonic()
    for i in range(20):
        assert rpc.rpc_sync("worker1", f.add, (i, 1)) == i + 1
    assert time.monotonic() - t0 < 1.5 and not slow.done()
    assert slow.wait() == "slow"


def test_per_call_timeout(world):
    t0 = time.monotonic()
    with pytest.raises(rpc.RpcTimeoutError) as e:
        rpc.rpc_sync("worker1", f.sleep_and_return, (3.0,), timeout=0.3)
    assert isinstance(e.value, RuntimeError) and isinstance(e.value, TimeoutError)
    assert "worker1" in str(e.value) and time.monotonic() - t0 < 2.0
    with pytest.raises(RuntimeError, match="timeout"):
        rpc.rpc_async("worker2", f.sleep_and_return, (3.0,), timeout=0.3).wait()
    assert rpc.rpc_sync("worker1", f.add, (1, 1)) == 2


def test_graceful_shutdown_waits_for_outstanding_work(rpc_world):
    rpc_world(2)
    fut = rpc.rpc_async("worker1", f.nested_call, ("worker2", f.sleep_and_return, (0.5, "done")))
    rpc.shutdown()
    assert fut.done() and fut.value() == "done"
    with pytest.raises(RuntimeError, match="not been initialized"):
        rpc.rpc_sync("worker1", f.add, (1, 2))


def test_tensors_travel_and_distgrad_functions_run_remotely(rpc_world):
    distgrad = pytest.importorskip("distgrad")
    Tensor = pytest.importorskip("distgrad.autograd.tensor").Tensor
    if not hasattr(distgrad, "add"):
        pytest.skip("distgrad.add not available")
    rpc_world(1)
    a = Tensor._wrap(np.arange(4.0), requires_grad=True)
    b = Tensor._wrap(np.ones(4))
    back = rpc.rpc_sync("worker1", f.echo, ((a, b),))
    assert isinstance(back[0], Tensor) and back[0].requires_grad and not back[1].requires_grad
    np.testing.assert_array_equal(back[0]._data, a._data)
    out = rpc.rpc_sync("worker1", distgrad.add, args=(a.detach() if hasattr(a, "detach") else a, b))
    assert isinstance(out, Tensor)
    np.testing.assert_array_equal(out._data, np.arange(4.0) + 1)

"""The profiler across RPC: a callee's work lands in the caller's profile (which PyTorch's
profiler cannot do), nested calls too, and a distributed backward's parts on every
process land in one trace, with arrows from each message's send to its serving."""
import json
from collections import Counter

import numpy as np
import pytest

import distgrad
from distgrad.autograd import profiling
from distgrad.distributed import autograd as dist_autograd
from distgrad.distributed import rpc
from distgrad.profiler import profile
from distgrad.rpc import interceptors, profiling as rpc_profiling
from support import dist_funcs as df
from support import profiler_funcs as pf
from support import rpc_funcs as rf

pytestmark = pytest.mark.timeout(90)

WORK = "rpc_async#support.profiler_funcs.work(worker0 -> worker1)"


@pytest.fixture
def world(rpc_world):
    return rpc_world(2, scope="module")


def test_the_callees_work_is_in_the_callers_profile(world):
    with profile(record_shapes=True) as prof:
        assert rpc.rpc_sync("worker1", pf.work, (3,)).item() == 27.0
    events = prof.events()
    (caller,) = [e for e in events if e.name == WORK and e.node_id == -1]
    (serving,) = [e for e in events if e.name == WORK and e.node_id == 1]
    assert not caller.is_async and serving.is_remote
    assert [c.name for c in serving.cpu_children] == ["aten::ones", "aten::matmul", "aten::sum"]
    matmul = serving.cpu_children[1]
    assert matmul.node_id == 1 and matmul.input_shapes == [[3, 3], [3, 3]]
    table = prof.key_averages().table()
    assert "Node ID" in table.splitlines()[1]
    assert any(r.split()[0] == "aten::matmul" and r.split()[-1] == "1"
               for r in table.splitlines()[3:-2])
    assert rpc.rpc_sync("worker1", pf.peer_sessions) == 0  # collected, and released


def test_a_waited_call_stays_a_slice_of_its_thread_with_python_events(world):
    with profile(with_stack=True) as prof:
        rpc.rpc_sync("worker1", pf.work, (2,))
    (caller,) = [e for e in prof.events() if e.name == WORK and e.node_id == -1]
    assert not caller.is_async
    assert any(c.is_python_function for c in caller.cpu_children)  # waiting for the reply
    remote = [e for e in prof.events() if e.node_id == 1 and e.is_python_function]
    assert any(e.name.endswith(": work") for e in remote)  # the callee traced its Python too


def test_an_op_called_remotely_is_named_as_pytorch_names_it(world):
    a = distgrad.ones(2, 2)
    with profile() as prof:
        rpc.rpc_sync("worker1", distgrad.mm, (a, a))
    names = {(e.name, e.node_id) for e in prof.events()}
    assert ("rpc_async#aten::mm(worker0 -> worker1)", -1) in names
    assert ("aten::mm", 1) in names


def test_nested_calls_are_collected_from_every_worker(world):
    with profile() as prof:
        fut = rpc.rpc_async("worker1", rf.nested_call, ("worker2", pf.work, (2,)))
        distgrad.ones(2) * 2  # the caller goes on meanwhile: its call is an async event
        assert fut.wait().item() == 8.0
    events = prof.events()
    outer = next(e for e in events if e.name.startswith("rpc_async#support.rpc_funcs.nested")
                 and e.node_id == -1)
    assert outer.is_async
    inner = [e for e in events if e.name == "rpc_async#support.profiler_funcs.work(worker1 -> "
             "worker2)"]
    assert sorted(e.node_id for e in inner) == [1, 2]
    assert Counter(e.node_id for e in events if e.name == "aten::matmul") == {2: 1}
    for worker in ("worker1", "worker2"):
        assert rpc.rpc_sync(worker, pf.peer_sessions) == 0


def test_calls_outside_a_profile_are_not_recorded(world):
    rpc.rpc_sync("worker1", pf.work, (2,))
    assert rpc.rpc_sync("worker1", pf.peer_sessions) == 0
    with profile():
        pass
    assert rpc.rpc_sync("worker1", pf.peer_sessions) == 0


def _flows_end_inside_a_slice(trace):
    """Every arrow's end is inside a complete event of its process and thread (that is what
    a trace viewer binds it to), and starts in another process."""
    slices = {}
    for e in trace["traceEvents"]:
        if e.get("ph") == "X":
            slices.setdefault((e["pid"], e["tid"]), []).append((e["ts"], e["ts"] + e["dur"]))
    ends = [e for e in trace["traceEvents"] if e.get("ph") == "f" and e["cat"] == "rpc"]
    starts = {e["id"]: e for e in trace["traceEvents"] if e.get("ph") == "s" and e["cat"] == "rpc"}
    for f in ends:
        assert any(a <= f["ts"] <= b for a, b in slices.get((f["pid"], f["tid"]), ()))
        assert starts[f["id"]]["pid"] != f["pid"]
    return ends, starts


def test_a_distributed_backward_lands_in_one_trace_with_flows(world, tmp_path):
    rpc.rpc_sync("worker1", df.make_params, ("p1", 1, [(4, 5), (5,)]))
    rpc.rpc_sync("worker2", df.make_params, ("p2", 2, [(5, 3), (3,)]))
    x = distgrad.tensor(np.ones((3, 4)), requires_grad=True)
    with dist_autograd.context() as cid:
        with profile() as prof:
            y = rpc.rpc_sync("worker1", df.stage, ("p1", x))
            z = rpc.rpc_sync("worker2", df.stage, ("p2", y))
            dist_autograd.backward(cid, [z.sum()])
        assert dist_autograd.get_gradients(cid)[x].shape == (3, 4)
    nodes = Counter((e.name, e.node_id) for e in prof.events() if e.scope == 1)
    for node_id in (1, 2):
        assert nodes["MmBackward0", node_id] == 1 and nodes["TanhBackward0", node_id] == 1
        assert nodes["torch::distributed::autograd::SendRpcBackward", node_id] == 1
        assert nodes["torch::distributed::autograd::RecvRpcBackward", node_id] == 1
    assert nodes["torch::distributed::autograd::RecvRpcBackward", -1] == 2  # y and z
    assert nodes["torch::autograd::AccumulateGrad", 1] == 2  # worker1's weight and bias
    prof.export_chrome_trace(str(tmp_path / "trace.json"))
    trace = json.load(open(tmp_path / "trace.json"))
    processes = {e["pid"]: e["args"]["name"] for e in trace["traceEvents"]
                 if e.get("ph") == "M" and e["name"] == "process_name"}
    assert sorted(processes.values()) == ["worker0 (rank 0)", "worker1 (rank 1)",
                                          "worker2 (rank 2)"]
    backward_pids = {e["pid"] for e in trace["traceEvents"] if e.get("ph") == "X"
                     and e["name"] == "torch::distributed::autograd::SendRpcBackward"}
    assert backward_pids == set(processes)  # x's (on worker0), y's and the worker2 input's
    ends, starts = _flows_end_inside_a_slice(trace)
    assert {f["pid"] for f in ends} == set(processes)  # every process is at an arrow's end
    assert len(ends) >= 6
    for worker in ("worker1", "worker2"):
        assert rpc.rpc_sync(worker, pf.peer_sessions) == 0


def test_a_malformed_profiler_extra_is_served_unrecorded():
    class Request:
        def __init__(self, extra):
            self.value, self.state = extra, {}

        def extra(self, name):
            return self.value
    interceptor = next(ic for name, ic in interceptors.installed() if name == "profiler")
    for extra in (None, 3, [1, 2, 3], [1, 2, 3, 4, "x" * 10_000], ["1", 2, 3, 4, "n"]):
        assert interceptor.request_scope(Request(extra)) is None
    assert rpc_profiling.MAX_SESSION_EVENTS > 0 and profiling.MAX_PEER_SESSIONS > 0

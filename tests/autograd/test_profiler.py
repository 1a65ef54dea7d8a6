"""``distgrad.autograd.profiler``: the events of a small program compared with PyTorch's
(names, nesting, counts, sequence numbers, shapes), its table and trace, and its errors."""
import gzip
import json
import pickle
import threading
import warnings

import numpy as np
import pytest

import distgrad
from distgrad.testing.oracle import torch as _torch
from distgrad.autograd import profiler
from distgrad.autograd import profiling

pytestmark = pytest.mark.timeout(60)

ENGINE = "autograd::engine::evaluate_function: "


def _program(lib):
    """mm, tanh, add, sum in a labelled block, then backward to one leaf."""
    w = lib.tensor(np.arange(12.0).reshape(4, 3) / 10, requires_grad=True)
    x = lib.tensor(np.ones((2, 4)))
    with lib.autograd.profiler.record_function("model"):
        y = lib.mm(x, w).tanh()
        loss = (y + 1).sum()
    loss.backward()


def _profile(lib, **options):
    with lib.autograd.profiler.profile(**options) as prof:
        _program(lib)
    return prof


def _top_level(events):
    """Names of the events nothing encloses, without PyTorch's internal ones (the root
    gradient's ``aten::ones_like``)."""
    return [e.name for e in events if e.cpu_parent is None and not e.name.startswith("aten::")]


def _children(events, name):
    (parent,) = [e for e in events if e.name == name]
    return [c.name for c in parent.cpu_children]


@pytest.fixture
def torch():
    """PyTorch, imported when the tests are collected (not under a test's timeout)."""
    if _torch is None:
        pytest.skip("PyTorch is not installed: nothing to compare with")
    return _torch


def test_events_nest_and_count_as_pytorchs(torch):
    ours, theirs = _profile(distgrad).function_events, _profile(torch).function_events
    assert _top_level(ours) == _top_level(theirs) == [
        "model", ENGINE + "SumBackward0", ENGINE + "AddBackward0", ENGINE + "TanhBackward0",
        ENGINE + "MmBackward0", ENGINE + "torch::autograd::AccumulateGrad"]
    assert _children(ours, "model") == _children(theirs, "model") == [
        "aten::mm", "aten::tanh", "aten::add", "aten::sum"]
    for node in ("SumBackward0", "MmBackward0", "torch::autograd::AccumulateGrad"):
        assert _children(ours, ENGINE + node)[:1] == _children(theirs, ENGINE + node)[:1] \
            == [node]
    count = lambda evs: {n: sum(e.name == n for e in evs) for n in _top_level(evs)}  # noqa: E731
    assert count(ours) == count(theirs)


def test_sequence_numbers_pair_forward_ops_with_their_nodes(torch):
    def pairs(events):
        fwd = {e.sequence_nr: e.name for e in events if e.name.startswith("aten::")
               and e.sequence_nr >= 0 and e.cpu_parent is not None and e.cpu_parent.name == "model"}
        bwd = {e.sequence_nr: e.name for e in events if e.scope == 1}
        return sorted((fwd[s], bwd[s]) for s in fwd if s in bwd)
    ours, theirs = _profile(distgrad).function_events, _profile(torch).function_events
    assert pairs(ours) == pairs(theirs) == [
        ("aten::add", "AddBackward0"), ("aten::mm", "MmBackward0"),
        ("aten::sum", "SumBackward0"), ("aten::tanh", "TanhBackward0")]
    node = next(e for e in ours if e.name == "MmBackward0")
    assert node.fwd_thread == node.thread and node.cpu_parent.fwd_thread == node.thread


def test_record_shapes_gives_pytorchs_input_shapes(torch):
    def shapes(events):  # (PyTorch lists every argument of an op's schema: sum's dtype too)
        return {e.name: e.input_shapes for e in events if e.name in (
            "aten::mm", "aten::tanh", "MmBackward0", ENGINE + "MmBackward0")
            and (e.cpu_parent is None or e.cpu_parent.name in ("model", ENGINE + "MmBackward0"))}
    ours = shapes(_profile(distgrad, record_shapes=True).function_events)
    assert ours == shapes(_profile(torch, record_shapes=True).function_events)
    assert ours["aten::mm"] == [[2, 4], [4, 3]] and ours["MmBackward0"] == [[2, 3]]
    averaged = _profile(distgrad, record_shapes=True).key_averages(group_by_input_shape=True)
    assert any(a.key == "aten::mm" and a.input_shapes == [[2, 4], [4, 3]] for a in averaged)


def test_table_has_pytorchs_columns(torch):
    def header(prof, **kw):
        lines = prof.key_averages().table(**kw).splitlines()
        return [h.strip() for h in lines[1].split("  ") if h.strip()], lines[-1].split(":")[0]
    for options in ({}, {"profile_memory": True}, {"record_shapes": True}):
        want = header(_profile(torch, **options), sort_by="self_cpu_time_total", row_limit=3)
        got = header(_profile(distgrad, **options), sort_by="self_cpu_time_total", row_limit=3)
        if options.get("record_shapes"):  # (key_averages() without grouping: no shapes)
            assert "Input Shapes" not in got[0]
        assert got == want
    averages = _profile(distgrad).key_averages()
    table = averages.table(sort_by="cpu_time_total", row_limit=2)
    rows = table.splitlines()[3:5]
    # the two largest totals, in order (which ones they are depends on the machine's load:
    # a backward node preempted once outgrows the labelled forward block)
    top = sorted(averages, key=lambda a: a.cpu_time_total, reverse=True)[:2]
    assert len(rows) == 2 and [r.split()[0][:6] for r in rows] == [a.key[:6] for a in top]
    assert table.rstrip().splitlines()[-1].startswith("Self CPU time total: ")


def test_key_averages_counts_and_times():
    x = distgrad.ones(3, 3, requires_grad=True)
    with profiler.profile() as prof:
        for _ in range(3):
            (x * x).sum().backward()
    avg = {a.key: a for a in prof.key_averages()}
    assert avg["aten::mul"].count == avg["MulBackward0"].count == 3
    mul = avg["aten::mul"]
    assert mul.cpu_time_total > 0 and mul.cpu_time == pytest.approx(mul.cpu_time_total / 3)
    total = prof.total_average()
    assert total.key == "Total" and total.count == len(prof.function_events)
    assert prof.self_cpu_time_total == pytest.approx(
        sum(e.self_cpu_time_total for e in prof.function_events))


def test_an_op_times_what_it_calls_as_its_own():
    """An op made of others (division by a number: reciprocal, then mul) is one event."""
    x = distgrad.ones(2, requires_grad=True)
    with profiler.profile() as prof:
        2 / x
    assert [e.name for e in prof.function_events] == ["aten::div"]


def test_every_way_of_calling_an_op_is_seen():
    x = distgrad.ones(2, 2)
    with profiler.profile() as prof:
        distgrad.add(x, x)
        x.add(x)
        x + x
        1 + x
        x.add_(1)
        x += 1
        distgrad.nn.functional.mse_loss(x, x)
        distgrad.nn.Linear(2, 2)(x)
    assert [e.name for e in prof.function_events if e.cpu_parent is None] == [
        "aten::add"] * 4 + ["aten::add_"] * 2 + ["aten::mse_loss", "aten::empty", "aten::empty",
                                                 "aten::linear"]


def test_record_function_as_decorator_and_on_a_future():
    @profiler.record_function("helper")
    def helper(t):
        return t * 2

    fut, one = distgrad.futures.Future(), distgrad.ones(1)
    with profiler.profile() as prof:
        helper(one)
        rf = profiler.record_function("waiting")
        with rf:
            chained = rf._call_end_callbacks_on_future(fut)
        with pytest.raises(RuntimeError, match="only be called once"):
            rf._call_end_callbacks_on_future(fut)
        fut.set_result(5)
        assert chained.wait() == 5
    names = [e.name for e in prof.function_events]
    assert names == ["helper", "aten::mul", "waiting"]
    helper_event = prof.function_events[0]
    assert helper_event.is_user_annotation and helper_event.cpu_children[0].name == "aten::mul"


def test_other_threads_are_not_profiled_as_in_pytorch():
    x = distgrad.ones(2)
    with profiler.profile() as prof:
        t = threading.Thread(target=lambda: x * x)
        t.start()
        t.join()
        x + x
    assert [e.name for e in prof.function_events] == ["aten::add"]


def test_profile_memory_counts_what_an_op_allocates():
    x = distgrad.ones(256, 256)
    with profiler.profile(profile_memory=True) as prof:
        y = x * 2  # noqa: F841 - kept alive: its buffer is what the op allocated
    (mul,) = prof.function_events
    assert mul.cpu_memory_usage >= 256 * 256 * 4 and mul.self_cpu_memory_usage == \
        mul.cpu_memory_usage


def test_with_stack_records_python_functions():
    def inner(t):
        return t * 2

    with profiler.profile(with_stack=True) as prof:
        inner(distgrad.ones(2))
    events = prof.function_events
    py = [e for e in events if e.is_python_function]
    assert any(e.name.endswith(": inner") and "test_profiler.py(" in e.name for e in py)
    mul = next(e for e in events if e.name == "aten::mul")
    parent = mul.cpu_parent
    assert parent is not None and parent.is_python_function
    assert not any("profiling.py" in e.name for e in py)  # the op wrappers stay out


def test_with_flops_counts_matrix_products():
    a, b = distgrad.ones(8, 16), distgrad.ones(16, 4)
    with profiler.profile(with_flops=True) as prof:
        a @ b
        distgrad.mm(a, b)
    assert [e.flops for e in prof.function_events] == [2 * 8 * 16 * 4] * 2
    assert "Total KFLOPs" in prof.key_averages().table()


def test_chrome_trace_has_kinetos_layout_and_forward_backward_arrows(tmp_path, torch):
    def load(lib, path):
        _profile(lib, record_shapes=True).export_chrome_trace(str(path))
        return json.load(open(path))
    ours, theirs = load(distgrad, tmp_path / "a.json"), load(torch, tmp_path / "b.json")
    assert set(theirs) <= set(ours)
    by_name, theirs_by_name = {}, {}  # (the first of a name: the forward op's)
    for events, names in ((ours, by_name), (theirs, theirs_by_name)):
        for e in events["traceEvents"]:
            if e.get("ph") == "X":
                names.setdefault(e["name"], e)
    for name in ("aten::mm", "MmBackward0", "model"):
        assert by_name[name]["cat"] == theirs_by_name[name]["cat"]
    assert by_name["aten::mm"]["args"]["Input Dims"] == [[2, 4], [4, 3]]
    assert set(theirs_by_name["aten::mm"]["args"]) >= set(by_name["aten::mm"]["args"]) - {
        "CPU Mem"}
    flows = [e for e in ours["traceEvents"] if e["ph"] in "sf" and e["cat"] == "fwdbwd"]
    assert len(flows) == 8 and {e["ph"] for e in flows} == {"s", "f"}
    _profile(distgrad).export_chrome_trace(str(tmp_path / "c.json.gz"))
    assert json.load(gzip.open(tmp_path / "c.json.gz", "rt"))["traceEvents"]


def test_event_list_exports(tmp_path):
    prof = _profile(distgrad, with_stack=True)
    prof.function_events.export_chrome_trace(str(tmp_path / "legacy.json"))
    records = json.load(open(tmp_path / "legacy.json"))
    assert {r["pid"] for r in records} == {"CPU functions"}
    assert any(r["name"] == "aten::mm" for r in records)
    with pytest.raises(ValueError, match="metric should be one of"):
        prof.export_stacks(str(tmp_path / "s.txt"), "wall_time")
    with pytest.raises(AssertionError, match="requires with_stack=True"):
        _profile(distgrad).export_stacks(str(tmp_path / "s.txt"))


def test_errors_and_warnings_as_pytorchs():
    prof = profiler.profile()
    with prof:
        pass
    with pytest.raises(RuntimeError, match="Profiler context manager is not reentrant"):
        prof.__enter__()
    with pytest.warns(FutureWarning, match="use_cuda"), \
            pytest.warns(UserWarning, match="CUDA is not available, disabling CUDA profiling"):
        profiler.profile(use_cuda=True)
    with pytest.warns(UserWarning, match="The foo is not a valid device option."):
        profiler.profile(use_device="foo")
    with pytest.raises(AssertionError, match="Device-only events supported only with Kineto"):
        profiler.profile(use_cpu=False)
    with pytest.raises(ValueError, match="post_processing_timeout_s must be non-negative"):
        profiler.profile(post_processing_timeout_s=-1)
    with pytest.raises(RuntimeError, match="CPU only"):
        with profiler.emit_nvtx():
            pass
    with pytest.raises(RuntimeError, match="ITT"):
        with profiler.emit_itt():
            pass
    with profiler.emit_nvtx(enabled=False), profiler.profile(enabled=False) as off:
        assert off is None
    with pytest.raises(RuntimeError, match="load_nvprof"):
        profiler.load_nvprof("trace.nvvp")
    assert repr(profiler.profile()) == "<unfinished distgrad.autograd.profile>"


def test_the_wrappers_are_transparent_when_nothing_is_profiled():
    assert profiling._active == 0
    add = distgrad.add
    assert add.__name__ == "add" and add.__module__ == "distgrad.ops.arithmetic"
    assert pickle.loads(pickle.dumps(add)) is add
    x = distgrad.ones(2, requires_grad=True)
    y = distgrad.add(x, x)
    assert y.grad_fn.name() == "AddBackward0"
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with profiler.profile():
            pass
    assert profiling._active == 0


def test_leaves_accumulate_as_without_the_profiler():
    """A leaf's .grad takes over the gradient buffer with or without the profiler."""
    def run(profiled):
        x = distgrad.ones(3, requires_grad=True)
        g = np.ones(3)
        if profiled:
            with profiler.profile():
                x.backward(distgrad.from_numpy(g))
        else:
            x.backward(distgrad.from_numpy(g))
        g[0] = 7.0
        return x.grad.numpy()[0]
    assert run(True) == run(False)

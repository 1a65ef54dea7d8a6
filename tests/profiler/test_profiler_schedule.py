"""``distgrad.profiler``: schedules, steps, trace handlers and activities, each compared with
``torch.profiler`` running the same loop (skipped where PyTorch is absent)."""
import json
import os
import warnings

import pytest

import distgrad
from distgrad.testing.oracle import torch as _torch
from distgrad import profiler
from distgrad.profiler import ProfilerAction, ProfilerActivity

pytestmark = pytest.mark.timeout(60)

SCHEDULES = [dict(wait=1, warmup=1, active=2), dict(wait=1, warmup=1, active=2, repeat=1),
             dict(wait=0, warmup=1, active=1, repeat=2, skip_first=2),
             dict(wait=3, warmup=1, active=1, skip_first=1, skip_first_wait=1)]


@pytest.fixture
def torch():
    """PyTorch, imported when the tests are collected (not under a test's timeout)."""
    if _torch is None:
        pytest.skip("PyTorch is not installed: nothing to compare with")
    return _torch


@pytest.mark.parametrize("kwargs", SCHEDULES)
def test_schedule_actions_are_pytorchs(torch, kwargs):
    ours = profiler.schedule(**kwargs)
    theirs = torch.profiler.schedule(**kwargs)
    assert [ours(i).name for i in range(14)] == [theirs(i).name for i in range(14)]


def test_schedule_checks_its_arguments():
    with pytest.raises(AssertionError, match="Invalid profiler schedule arguments"):
        profiler.schedule(wait=0, warmup=1, active=0)
    with pytest.warns(UserWarning, match="won't be using warmup"):
        profiler.schedule(wait=0, warmup=0, active=1)
    with pytest.raises(AssertionError, match="Step must be non-negative"):
        profiler.schedule(wait=0, warmup=1, active=1)(-1)


def _loop(lib, steps=6, **kwargs):
    """Profile ``steps`` steps of a small matmul loop; what each trace-ready call saw."""
    seen = []

    def ready(prof):
        seen.append((prof.step_num, sorted(e.trace_name for e in prof.events()
                                           if e.name == "ProfilerStep*"),
                     sum(e.name == "aten::mm" for e in prof.events())))
    x = lib.ones(3, 3)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with lib.profiler.profile(on_trace_ready=ready, **kwargs) as p:
            for _ in range(steps):
                lib.mm(x, x)
                p.step()
    return seen, p


@pytest.mark.parametrize("kwargs", SCHEDULES)
def test_trace_ready_and_steps_are_pytorchs(torch, kwargs):
    ours, _ = _loop(distgrad, 9, schedule=profiler.schedule(**kwargs))
    theirs, _ = _loop(torch, 9, schedule=torch.profiler.schedule(**kwargs))
    assert ours == theirs and ours


def test_without_a_schedule_everything_is_one_trace(torch):
    ours, p = _loop(distgrad, 3)
    theirs, _ = _loop(torch, 3)
    assert ours == theirs == [(3, [], 3)]
    assert p.step_num == 3


def test_start_stop_and_acc_events():
    x = distgrad.ones(2, 2)
    p = profiler.profile(acc_events=True)
    for _ in range(2):
        p.start()
        x @ x
        p.stop()
    assert sum(e.name == "aten::matmul" for e in p.events()) == 2
    p = profiler.profile()
    p.start()
    x @ x
    p.toggle_collection_dynamic(False, [ProfilerActivity.CPU])
    x * x
    p.toggle_collection_dynamic(True, [ProfilerActivity.CPU])
    x + x
    p.stop()
    assert [e.name for e in p.events()] == ["aten::matmul", "aten::add"]


def test_tensorboard_trace_handler_writes_one_file_per_cycle(tmp_path):
    handler = profiler.tensorboard_trace_handler(str(tmp_path / "log"), worker_name="w0")
    x = distgrad.ones(2, 2)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # PyTorch's "Profiler clears events..." note
        with profiler.profile(schedule=profiler.schedule(wait=0, warmup=1, active=1, repeat=2),
                              on_trace_ready=handler) as p:
            for _ in range(4):
                x @ x
                p.step()
    files = sorted(os.listdir(tmp_path / "log"))
    assert len(files) == 2 and all(f.startswith("w0.") and f.endswith(".pt.trace.json")
                                   for f in files)
    trace = json.load(open(tmp_path / "log" / files[0]))
    names = [e["name"] for e in trace["traceEvents"] if e.get("ph") == "X"]
    assert "ProfilerStep#1" in names and "aten::matmul" in names
    gz = profiler.tensorboard_trace_handler(str(tmp_path / "gz"), use_gzip=True)
    with profiler.profile(on_trace_ready=gz):
        x @ x
    (name,) = os.listdir(tmp_path / "gz")
    assert name.endswith(".pt.trace.json.gz") and "_" in name


def test_cuda_requested_on_a_cpu_only_build_as_pytorchs(torch):
    def outcome(lib, activities, **kwargs):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                with lib.profiler.profile(activities=activities, **kwargs) as p:
                    lib.ones(2) * 2
                result = "aten::mul" in {e.name for e in p.events()}
            except AssertionError as e:
                result = f"AssertionError: {e}"
        return result, sorted({str(w.message) for w in caught if "CUDA" in str(w.message)
                               or "use_cuda" in str(w.message)})
    for acts in (["CUDA"], ["CPU", "CUDA"]):
        ours = outcome(distgrad, [ProfilerActivity[a] for a in acts])
        theirs = outcome(torch, [getattr(torch.profiler.ProfilerActivity, a) for a in acts])
        assert ours == theirs
    assert outcome(distgrad, None, use_cuda=True) == outcome(torch, None, use_cuda=True)
    assert profiler.supported_activities() == {ProfilerActivity.CPU}
    assert [a.value for a in ProfilerActivity] == \
        [getattr(torch.profiler.ProfilerActivity, a.name).value for a in ProfilerActivity]


def test_bad_activities_and_schedules():
    with pytest.raises(ValueError, match="specified more than once"):
        profiler.profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CPU])
    with pytest.raises(AssertionError, match="No valid profiler activities found"):
        profiler.profile(activities=[])
    with pytest.raises(ValueError, match="DEVICE_STOPPED"):
        profiler.profile(schedule=lambda step: ProfilerAction.DEVICE_STOPPED)
    with pytest.raises(AssertionError, match="must be initialized"):
        profiler.profile().events()
    with pytest.raises(NotImplementedError):
        profiler.ExecutionTraceObserver()


def test_metadata_reaches_the_trace(tmp_path):
    with profiler.profile(record_shapes=True) as p:
        distgrad.ones(2) * 2
    p.add_metadata("run", "a")
    p.add_metadata_json("step", "3")
    p.export_chrome_trace(str(tmp_path / "t.json"))
    doc = json.load(open(tmp_path / "t.json"))
    assert doc["run"] == "a" and doc["step"] == 3 and doc["record_shapes"] == 1
    assert doc["trace_id"] == p.get_trace_id() and len(doc["trace_id"]) == 32

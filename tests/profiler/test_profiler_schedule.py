"""``distgrad.profiler``: schedules, steps, trace handlers and activities, compared with
``torch.profiler``. Its schedules are compared live; what its ``profile`` loops do is
recorded below, because PyTorch's first ``torch.profiler.profile`` imports its compiler
(``torch._inductor``: 5-30 s): the ``slow`` tests check the recordings against it."""
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
# What on_trace_ready sees in 9 steps of _loop with each schedule under torch.profiler:
# (step_num, the steps recorded, aten::mm events) per call
TORCH_TRACES = [
    [(4, ["ProfilerStep#2", "ProfilerStep#3"], 2), (8, ["ProfilerStep#6", "ProfilerStep#7"], 2)],
    [(4, ["ProfilerStep#2", "ProfilerStep#3"], 2)],
    [(4, ["ProfilerStep#3"], 1), (6, ["ProfilerStep#5"], 1)],
    [(3, ["ProfilerStep#2"], 1), (8, ["ProfilerStep#7"], 1)]]
TORCH_NO_SCHEDULE = [(3, [], 3)]  # 3 steps without a schedule: one trace at the end
# profile(activities=...) on a CPU-only build: (recorded?, warnings about CUDA)
CUDA_WARNING = "CUDA is not available, disabling CUDA profiling"
TORCH_CUDA_OUTCOMES = {
    ("CUDA",): ("AssertionError: No activities specified for the profiler", [CUDA_WARNING]),
    ("CPU", "CUDA"): (True, [CUDA_WARNING]),
    "use_cuda=True": (True, ["`use_cuda` is deprecated, use `activities` argument instead"])}


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


@pytest.mark.parametrize("kwargs, want", list(zip(SCHEDULES, TORCH_TRACES)))
def test_trace_ready_and_steps_are_pytorchs(kwargs, want):
    assert _loop(distgrad, 9, schedule=profiler.schedule(**kwargs))[0] == want


def test_without_a_schedule_everything_is_one_trace():
    ours, p = _loop(distgrad, 3)
    assert ours == TORCH_NO_SCHEDULE and p.step_num == 3


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_recorded_traces_are_pytorchs(torch, request):
    if "slow" not in (request.config.getoption("markexpr") or ""):
        pytest.skip("torch.profiler's first use imports torch._inductor: run with -m slow")
    for kwargs, want in zip(SCHEDULES, TORCH_TRACES):
        assert _loop(torch, 9, schedule=torch.profiler.schedule(**kwargs))[0] == want
    assert _loop(torch, 3)[0] == TORCH_NO_SCHEDULE
    for key, want in TORCH_CUDA_OUTCOMES.items():
        assert _cuda_outcome(torch, key) == want


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


def _cuda_outcome(lib, key):
    """What profiling with the activities ``key`` (or ``use_cuda=True``) does in ``lib``."""
    if key == "use_cuda=True":
        activities, kwargs = None, {"use_cuda": True}
    else:
        activities, kwargs = [getattr(lib.profiler.ProfilerActivity, a) for a in key], {}
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


@pytest.mark.parametrize("key", list(TORCH_CUDA_OUTCOMES))
def test_cuda_requested_on_a_cpu_only_build_as_pytorchs(key):
    assert _cuda_outcome(distgrad, key) == TORCH_CUDA_OUTCOMES[key]


def test_activities_are_pytorchs(torch):
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

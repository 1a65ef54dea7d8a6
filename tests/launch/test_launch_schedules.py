"""``distgrad launch`` on every schedule of ``distgrad.distributed.pipelining``
(``pipeline.schedule``, ``pipeline.virtual_stages``): the losses of the one-process run,
bit for bit; each worker's F, B, I and W actions in the trace; resuming; a failure
report naming the worker, its step and the error."""
import json

import pytest

pytest.importorskip("zmq")
pytest.importorskip("msgpack")

from launch_support import FAULTY, reference  # noqa: E402

pytestmark = pytest.mark.timeout(180)

# (interleavedzerobubble and zbvzerobubble: the trace and resume tests below)
SCHEDULES = [("interleaved1f1b", 2, 4), ("loopedbfs", 2, 3), ("dualpipev", 2, 4)]


@pytest.mark.parametrize("name,virtual,micro", SCHEDULES, ids=[s[0] for s in SCHEDULES])
def test_every_schedule_trains_like_one_process(launcher, tiny_config, name, virtual, micro):
    overrides = [f"pipeline.schedule={name}", f"pipeline.virtual_stages={virtual}",
                 f"pipeline.micro_batches={micro}", "run.steps=4"]
    launch = launcher(tiny_config, *overrides)
    assert launch.wait(120) == 0, launch.output
    assert launch.losses() == reference(tiny_config, overrides)   # bit for bit


def test_the_trace_shows_each_worker_forward_and_split_backward(launcher, tiny_config, tmp_path):
    overrides = ["pipeline.schedule=interleavedzerobubble", "pipeline.virtual_stages=2",
                 "pipeline.micro_batches=4", "run.steps=3"]
    launch = launcher(tiny_config, *overrides, "--trace", "trace.json")
    assert launch.wait(120) == 0, launch.output
    assert launch.losses() == reference(tiny_config, overrides)
    trace = json.loads((tmp_path / "trace.json").read_text())["traceEvents"]
    spans = [e for e in trace if e["ph"] == "X" and "action" in e.get("args", {})]
    for pid, stages in ((1, {0, 2}), (2, {1, 3})):  # worker 1: stages 0 and 2, worker 2: 1, 3
        mine = [e for e in spans if e["pid"] == pid and e["args"]["step"] >= 0]  # no eval
        assert {e["name"] for e in mine} == {"forward", "backward inputs", "backward weights"}
        assert {e["args"]["stage"] for e in mine} == stages
        assert len(mine) == 3 * 3 * 2 * 4  # steps x (F, I, W) x stages x micro-batches
    sends = {e["id"] for e in trace if e["ph"] == "s"}
    receipts = {e["id"] for e in trace if e["ph"] == "f"}
    assert sends == receipts and len(sends) > 3 * 3 * 4 * 2


def test_resume_reproduces_an_uninterrupted_run(launcher, tiny_config):
    overrides = ["pipeline.schedule=zbvzerobubble", "pipeline.virtual_stages=2",
                 "pipeline.micro_batches=2", "checkpoint.every=2"]
    first = launcher(tiny_config, *overrides, "run.steps=2")
    assert first.wait(120) == 0, first.output
    second = launcher(tiny_config, *overrides, "run.steps=4", "--resume", "--run-dir",
                      first.run_dir)
    assert second.wait(120) == 0, second.output
    assert second.losses() == reference(tiny_config, overrides, steps=4)


def test_a_failure_names_the_worker_holding_the_failed_stage(launcher, tiny_config, tmp_path):
    (tmp_path / "faulty.py").write_text(FAULTY)
    # the trap is the model's last layer: in a V, stage 3 is on the first worker
    launch = launcher(tiny_config, 'model.factory="faulty:model"', "model.kwargs={at = 3}",
                      "pipeline.schedule=zbvzerobubble", "pipeline.virtual_stages=2")
    assert launch.wait(120) == 1, launch.output
    assert "FAILED: worker1 (rank 1, stage 0) failed: ZeroDivisionError: trap sprung at " \
           "call 3 at step 3" in launch.output


def test_schedules_that_cannot_run_a_config_say_why(launcher, tiny_config):
    launch = launcher(tiny_config, "pipeline.schedule=zbvzerobubble", "--check")
    assert launch.wait() == 2
    assert "pipeline.schedule: pipeline.virtual_stages 1: 'zbvzerobubble' runs exactly 2 " \
           "stages per worker" in launch.output
    launch = launcher(tiny_config, "pipeline.schedule=dualpipev", "pipeline.virtual_stages=2",
                      "--check")
    assert launch.wait() == 2 and "dualpipev needs at least one per stage (4)" in launch.output
    launch = launcher(tiny_config, "pipeline.schedule=interleaved1f1b", "world.replicas=2",
                      "pipeline.virtual_stages=2", "--check")
    assert launch.wait() == 2 and "pipeline.virtual_stages: replicas of a one-worker " \
        "pipeline" in launch.output


def test_zero_bubble_with_data_parallel_replicas(launcher, tiny_config):
    # each replica's stages average their gradients after the step's W passes
    overrides = ["world.workers=4", "world.replicas=2", "pipeline.schedule=zbvzerobubble",
                 "pipeline.virtual_stages=2", "pipeline.micro_batches=2", "run.steps=4"]
    launch = launcher(tiny_config, *overrides)
    assert launch.wait(120) == 0, launch.output
    expected = reference(tiny_config, overrides)
    assert launch.losses() == pytest.approx(expected, rel=1e-5, abs=1e-6)

"""``world.strategy = "autograd"``: stages as remote modules, trained by the coordinator
through RPC futures, ``dist_autograd.backward`` and a ``DistributedOptimizer``.

The same tiny runs as ``test_launch.py``: losses equal the one-process run's bit for
bit, also with an auxiliary loss (a second backward over a retained graph), hooks
that run in the coordinator, a simulated link, checkpoints and resume; a failing
worker is reported as the pipeline strategy reports it.
"""
import json
import signal

import pytest

pytest.importorskip("zmq")
pytest.importorskip("msgpack")

import distgrad  # noqa: E402
from distgrad.launch import checkpoint as ckpt  # noqa: E402

from launch_support import FAULTY, assert_all_gone, kill_mid_run, reference  # noqa: E402

pytestmark = pytest.mark.timeout(120)

AUTOGRAD = ["world.strategy=autograd", "pipeline.micro_batches=4"]

HOOKS = '''
[[hooks]]
ref = "distgrad.launch.hooks:activation_stats"
kind = "forward"

[[hooks]]
ref = "distgrad.launch.hooks:grad_output_norm"
kind = "full_backward"
stages = [1, 2]

[[hooks]]
ref = "distgrad.launch.hooks:tensor_grad_norm"
kind = "tensor_grad"
parameter = "0.weight"
'''


def test_three_stages_with_an_auxiliary_loss_hooks_a_link_and_a_trace_train_like_one_process(
        launcher, tiny_config, tmp_path):
    config = tmp_path / "hooked.toml"
    config.write_text(tiny_config.read_text() + HOOKS)
    overrides = AUTOGRAD + ["world.workers=3", "model.aux_weight=0.5",
                            'world.simulated_link="200us 10Gbit/s"', "run.eval_every=3"]
    launch = launcher(config, *overrides, "--trace", "trace.json")
    assert launch.wait() == 0, launch.output
    assert launch.losses() == reference(config, overrides)      # bit for bit
    steps = [r for r in launch.metrics() if "loss" in r]
    assert all(r["aux_loss"] > 0 for r in steps)
    for r in steps:  # every hook reported, for the stages it is registered on
        assert {f"act_std.stage{k}" for k in range(3)} <= r.keys()
        assert {"grad_out_norm.stage1", "grad_out_norm.stage2"} <= r.keys()
        assert "grad_out_norm.stage0" not in r and r["param_grad_norm.stage0"] > 0
    assert [r["step"] for r in launch.metrics() if "eval_loss" in r] == [3, 6]
    trace = json.loads((tmp_path / "trace.json").read_text())["traceEvents"]
    spans = {(e["pid"], e["name"]) for e in trace if e["ph"] == "X"}
    assert {(0, "backward"), (0, "optimizer step")} <= spans
    assert all((stage, "forward") in spans for stage in (1, 2, 3))
    sends = {e["id"]: e for e in trace if e["ph"] == "s"}
    receipts = {e["id"]: e for e in trace if e["ph"] == "f"}
    # forward: each micro-batch to each stage (in training and 2 evaluations); backward:
    # its gradient up to the coordinator and down to the stage before, in 2 passes
    assert len([e for e in trace if e["ph"] == "f" and e["name"] == "act"]) == 8 * 4 * 3
    assert len([e for e in trace if e["ph"] == "f" and e["name"] == "grad"]) == 2 * 6 * 4 * 5
    for ident, receipt in receipts.items():
        assert receipt["ts"] >= sends[ident]["ts"] and receipt["pid"] != sends[ident]["pid"]
    assert_all_gone(launch.pids().values())


def test_resume_reproduces_an_uninterrupted_run(launcher, tiny_config):
    first = launcher(tiny_config, *AUTOGRAD, "run.steps=4", "checkpoint.every=2")
    assert first.wait() == 0, first.output
    run_dir = first.run_dir
    directory, manifest = ckpt.latest(run_dir)
    assert manifest["step"] == 4
    for stage in (0, 1):  # the pipeline strategy's files: model, optimizer state, RNG
        state = distgrad.load(ckpt.stage_path(directory, stage))
        assert state["step"] == 4 and state["optimizer"]["state"] and state["model"]
    second = launcher(tiny_config, *AUTOGRAD, "run.steps=8", "checkpoint.every=2", "--resume",
                      "--run-dir", run_dir)
    assert second.wait() == 0, second.output
    assert "steps 5..8, resumed from" in second.output
    assert second.losses() == reference(tiny_config, AUTOGRAD, steps=8)   # bit for bit


def test_a_killed_worker_stops_the_run_and_is_named(launcher, tiny_config):
    launch = launcher(tiny_config, *AUTOGRAD, "run.steps=100000", "run.log_every=1000")
    code, took, pids = kill_mid_run(launch, rank=2, after_steps=3)
    assert code == 128 + signal.SIGKILL, launch.output
    assert took < 5
    assert "FAILED: worker2 (rank 2, stage 1) was killed by SIGKILL at step" in launch.output
    assert_all_gone(pids.values())


def test_an_exception_on_a_worker_names_it_the_step_and_the_traceback(
        launcher, tiny_config, tmp_path):
    (tmp_path / "faulty.py").write_text(FAULTY)
    # 4 micro-batches a step: the trap's 14th call is micro-batch 2 of step 4
    launch = launcher(tiny_config, *AUTOGRAD, 'model.factory="faulty:model"',
                      "model.kwargs={at = 14}")
    assert launch.wait() == 1, launch.output
    out = launch.output
    assert "FAILED: worker2 (rank 2, stage 1) failed: ZeroDivisionError: trap sprung at " \
           "call 14 at step 4" in out, out
    assert "root cause:" in out and "faulty.py" in out and "Traceback" in out

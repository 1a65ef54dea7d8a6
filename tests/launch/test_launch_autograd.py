"""``world.strategy = "autograd"``: stages as remote modules, trained by the coordinator
through RPC futures, ``dist_autograd.backward`` and a ``DistributedOptimizer``.

The same tiny runs as ``test_launch.py``, whose tests of a run's life (resume, a
killed, stopped or failing worker) run in both strategies: here, losses equal the
one-process run's bit for bit with micro-batches, an auxiliary loss (a second
backward over a retained graph), hooks that run in the coordinator, a simulated link
and a trace.
"""
import json

import pytest

pytest.importorskip("zmq")
pytest.importorskip("msgpack")

from launch_support import assert_all_gone, reference  # noqa: E402

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
    # each stage steps its optimizer after its part of the step's last backward
    assert (0, "backward") in spans and (0, "optimizer step") not in spans
    assert all((stage, "optimizer step") in spans for stage in (1, 2, 3))
    assert all((stage, "forward") in spans for stage in (1, 2, 3))
    sends = {e["id"]: e for e in trace if e["ph"] == "s"}
    receipts = {e["id"]: e for e in trace if e["ph"] == "f"}
    # forward: each micro-batch from stage to stage (in training and 2 evaluations);
    # backward: the gradient of each stage's output, to it, in 2 passes
    assert len([e for e in trace if e["ph"] == "f" and e["name"] == "act"]) == 8 * 4 * 2
    assert len([e for e in trace if e["ph"] == "f" and e["name"] == "grad"]) == 2 * 6 * 4 * 3
    for ident, receipt in receipts.items():
        assert receipt["ts"] >= sends[ident]["ts"] and receipt["pid"] != sends[ident]["pid"]
    assert_all_gone(launch.pids().values())


def test_deferred_weight_gradients_train_like_one_process(launcher, tiny_config, tmp_path):
    # pipeline.defer_weight_grads (the default): each stage's linear weights get their
    # gradients in one product per step, accumulated into the distributed context before
    # the optimizer step; a weight with a hook (0.weight) is computed as usual
    config = tmp_path / "hooked.toml"
    config.write_text(tiny_config.read_text() + HOOKS)
    overrides = AUTOGRAD + ["world.workers=3"]
    launch = launcher(config, *overrides, "--trace", "trace.json")
    assert launch.wait() == 0, launch.output
    assert launch.losses() == reference(config, overrides)      # bit for bit
    assert all(r["param_grad_norm.stage0"] > 0 for r in launch.metrics() if "loss" in r)
    trace = json.loads((tmp_path / "trace.json").read_text())["traceEvents"]
    spans = {(e["pid"], e["name"]) for e in trace if e["ph"] == "X"}
    assert {(k, "weight gradients") for k in (1, 2, 3)} <= spans
    assert_all_gone(launch.pids().values())


def test_steps_in_flight_overlap_and_train_like_one_process(launcher, tiny_config, tmp_path):
    # No hooks: each step runs on a thread of its own, so the next step's forwards are
    # sent while this one's backward runs (run.in_flight = 2), and each stage runs a
    # step's first forward only after its optimizer stepped for the step before
    overrides = AUTOGRAD + ["world.workers=3", "model.aux_weight=0.5", "run.eval_every=3"]
    launch = launcher(tiny_config, *overrides, "--trace", "trace.json")
    assert launch.wait() == 0, launch.output
    assert launch.losses() == reference(tiny_config, overrides)      # bit for bit
    assert [r["step"] for r in launch.metrics() if "eval_loss" in r] == [3, 6]
    trace = json.loads((tmp_path / "trace.json").read_text())["traceEvents"]
    steps = sorted((e["args"]["step"], e["ts"], e["ts"] + e["dur"]) for e in trace
                   if e["ph"] == "X" and e["pid"] == 0 and e["name"] == "step")
    # a step starts before the one before it ended, except after an evaluation
    overlapping = [s for (s, start, _), (_, _, end) in zip(steps[1:], steps) if start < end]
    assert overlapping and not {3, 6} & set(overlapping), steps
    assert_all_gone(launch.pids().values())

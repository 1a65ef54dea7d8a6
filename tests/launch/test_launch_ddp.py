"""``distgrad launch`` with data-parallel replicas, end to end: ``world.strategy = "ddp"``
(every worker trains the whole model on its shard of each batch) and pipeline stages
replicated over the data (``world.replicas``).

The reference is the same training in one process on the whole batch: replicas
average their gradients, so they match it up to float rounding (the order of the
sums differs), not bit for bit; a resumed run matches an uninterrupted one bit for bit.
"""
import json
import os
import shutil
import signal

import pytest

pytest.importorskip("zmq")
pytest.importorskip("msgpack")

import distgrad  # noqa: E402
from distgrad.launch import checkpoint as ckpt  # noqa: E402

from launch_support import assert_all_gone, kill_mid_run, reference  # noqa: E402

pytestmark = pytest.mark.timeout(120)

DDP = ["world.strategy=ddp"]


def close_to(losses, expected):
    return len(losses) == len(expected) and losses == pytest.approx(expected, rel=1e-5,
                                                                   abs=1e-7)


def test_two_replicas_train_like_one_process_on_the_whole_batch(launcher, tiny_config,
                                                                tmp_path):
    overrides = DDP + ["optim.lr=0.03", "run.eval_every=3", "pipeline.micro_batches=2"]
    launch = launcher(tiny_config, *overrides, "--trace", "trace.json")
    assert launch.wait() == 0, launch.output
    expected = reference(tiny_config, overrides)
    assert close_to(launch.losses(), expected), (launch.losses(), expected)
    run_dir = launch.run_dir
    config = json.loads((run_dir / "launch.json").read_text())["config"]
    assert config["world"]["replicas"] == 2 and config["optim"]["lr"] == 0.03
    assert sorted(p.name for p in (run_dir / "logs").iterdir()) == [
        "0-coordinator.log", "1-worker1.log", "2-worker2.log"]
    evals = [r for r in launch.metrics() if "eval_loss" in r]
    assert [r["step"] for r in evals] == [3, 6] and evals[-1]["eval_accuracy"] > 0
    steps = [r for r in launch.metrics() if "loss" in r]
    assert all(0 <= r["accuracy"] <= 1 and r["samples_per_s"] > 0 for r in steps)
    assert "1 stage (layers [5]) x 2 data-parallel replicas" in launch.output
    assert "1 stage x 2 replicas" in launch.output
    trace = json.loads((tmp_path / "trace.json").read_text())["traceEvents"]
    names = {e["pid"]: e["args"]["name"] for e in trace if e["name"] == "process_name"}
    assert names == {0: "0:coordinator", 1: "1:worker1 (replica 0)",
                     2: "2:worker2 (replica 1)"}
    spans = {(e["pid"], e["name"]) for e in trace if e["ph"] == "X"}
    for worker in (1, 2):  # each replica: 2 micro-batches a step, one optimizer step
        assert {(worker, "forward"), (worker, "backward"), (worker, "optimizer step")} <= spans
    sends = {e["id"] for e in trace if e["ph"] == "s"}
    # the input and result of each step command (a run of up to 3 steps here: evaluations
    # every 3) on each worker
    assert sends == {e["id"] for e in trace if e["ph"] == "f"}
    assert 2 * 2 * 2 <= len(sends) <= 6 * 2 * 2
    assert_all_gone(launch.pids().values())


def test_a_resumed_run_equals_the_uninterrupted_one_bit_for_bit(launcher, tiny_config,
                                                                tmp_path):
    whole = launcher(tiny_config, *DDP, "run.steps=8", "checkpoint.every=4")
    assert whole.wait() == 0, whole.output
    manifest = ckpt.read_manifest(ckpt.step_dir(whole.run_dir, 4))
    assert (manifest["stages"], manifest["replicas"]) == (1, 2)
    assert sorted(os.listdir(ckpt.step_dir(whole.run_dir, 4))) == [
        ckpt.MANIFEST, "stage0.ckpt"]                          # one copy: replica 0's
    # the same run stopped after its checkpoint at step 4, then resumed
    cut = tmp_path / "cut"
    shutil.copytree(whole.run_dir, cut)
    shutil.rmtree(ckpt.step_dir(cut, 8))
    (cut / "result.json").unlink()                            # killed: it has none
    resumed = launcher(tiny_config, *DDP, "run.steps=8", "checkpoint.every=4", "--resume",
                       "--run-dir", cut)
    assert resumed.wait() == 0, resumed.output
    assert "steps 5..8, resumed from" in resumed.output
    assert resumed.losses() == whole.losses()                  # bit for bit
    assert [r["step"] for r in resumed.metrics() if "loss" in r] == list(range(1, 9))
    final = [distgrad.load(ckpt.stage_path(ckpt.step_dir(d, 8), 0))["model"]
             for d in (whole.run_dir, cut)]
    assert all((final[0][k] == final[1][k]).all() for k in final[0])


def test_a_killed_replica_is_named_with_its_step_and_exit_status(launcher, tiny_config):
    launch = launcher(tiny_config, *DDP, "run.steps=100000", "run.log_every=1000")
    code, took, pids = kill_mid_run(launch, rank=2, after_steps=5)
    assert code == 128 + signal.SIGKILL, launch.output
    assert took < 10  # the survivor's all-reduce fails at once; the launcher reaps all
    assert "FAILED: worker2 (rank 2, replica 1) was killed by SIGKILL at step" in launch.output
    assert_all_gone(pids.values())


def test_pipeline_stages_replicated_over_the_data_train_like_one_process(
        launcher, tiny_config, tmp_path):
    config = tmp_path / "hooked.toml"
    config.write_text(tiny_config.read_text()
                      + '[[hooks]]\nref = "distgrad.launch.hooks:grad_norm"\n')
    overrides = ["world.workers=4", "world.replicas=2", "pipeline.micro_batches=2",
                 "pipeline.schedule=1f1b", "checkpoint.every=3"]
    launch = launcher(config, *overrides)
    assert launch.wait() == 0, launch.output
    expected = reference(config, overrides)
    assert close_to(launch.losses(), expected), (launch.losses(), expected)
    assert "2 stages (layers [2, 3]) x 2 data-parallel replicas" in launch.output
    steps = [r for r in launch.metrics() if "loss" in r]
    assert all(r["grad_norm.stage0"] > 0 and r["grad_norm.stage1"] > 0 for r in steps)
    assert sorted(os.listdir(ckpt.step_dir(launch.run_dir, 6))) == [
        ckpt.MANIFEST, "stage0.ckpt", "stage1.ckpt"]
    assert_all_gone(launch.pids().values())

"""``distgrad launch`` end to end: real processes, real sockets, real failures.

Every run is tiny (a few steps of a 2-8-8-2 network), so a launch costs about the
start-up of its three or four Python processes.
"""
import json
import os
import re
import signal
import sys
import time

import pytest

pytest.importorskip("zmq")
pytest.importorskip("msgpack")

import distgrad  # noqa: E402
from distgrad.launch import checkpoint as ckpt  # noqa: E402

from launch_support import (DETECT_FAST, FAULTY, assert_all_gone, kill_mid_run,  # noqa: E402
                            reference)

pytestmark = pytest.mark.timeout(120)

#: the tests of a run's life that hold for both strategies (the pipeline's default and
#: world.strategy = "autograd", see test_launch_autograd.py), as their overrides
STRATEGIES = pytest.mark.parametrize("strategy", [[], ["world.strategy=autograd"]],
                                     ids=["pipeline", "autograd"])


def test_two_workers_train_like_one_process_with_overrides(launcher, tiny_config):
    overrides = ["optim.lr=0.03", "run.eval_every=3"]
    launch = launcher(tiny_config, *overrides)
    assert launch.wait() == 0, launch.output
    run_dir = launch.run_dir
    assert launch.losses() == reference(tiny_config, overrides)   # bit for bit
    record = json.loads((run_dir / "launch.json").read_text())
    assert record["overrides"] == overrides and record["version"] == distgrad.__version__
    assert record["config"]["optim"]["lr"] == 0.03 and record["config"]["run"]["name"] == "tiny"
    assert sorted(p.name for p in (run_dir / "logs").iterdir()) == [
        "0-coordinator.log", "1-worker1.log", "2-worker2.log"]
    assert json.loads((run_dir / "result.json").read_text())["status"] == "finished"
    evals = [r for r in launch.metrics() if "eval_loss" in r]
    assert [r["step"] for r in evals] == [3, 6] and "eval_accuracy" in evals[0]
    out = launch.output
    assert "0:coordinator | step 2/6" in out and "1:worker1 | " in out
    assert out.rstrip().endswith(f"run directory: {os.path.relpath(run_dir, launch.cwd)}")
    assert_all_gone(launch.pids().values())


@pytest.mark.skipif(not os.path.exists("/proc/self/task"), reason="reads /proc (Linux)")
def test_each_worker_and_all_its_threads_run_on_the_cores_it_was_given(launcher, tiny_config):
    from distgrad.utils.cpus import parse_cpus
    launch = launcher(tiny_config, "run.steps=600")   # still running when read
    launch.wait_for_steps(1)
    record = json.loads((launch.run_dir / "processes.json").read_text())
    assert sorted(record["cores"]) == ["1", "2"]   # the workers; the coordinator floats
    for rank, cores in record["cores"].items():
        pid = record["children"][rank]
        for task in os.listdir(f"/proc/{pid}/task"):   # RPC's threads too
            try:
                status = open(f"/proc/{pid}/task/{task}/status").read()
            except FileNotFoundError:  # a thread that ended meanwhile
                continue
            allowed = re.search(r"Cpus_allowed_list:\s*(\S+)", status).group(1)
            assert parse_cpus(allowed) == parse_cpus(cores), (rank, task)
    assert launch.wait() == 0, launch.output
    launch = launcher(tiny_config, "world.pin_workers=false")
    assert launch.wait() == 0, launch.output
    assert json.loads((launch.run_dir / "processes.json").read_text())["cores"] == {}


def test_three_workers_micro_batched_1f1b_with_hooks_and_a_trace(launcher, tiny_config,
                                                                 tmp_path):
    config = tmp_path / "hooked.toml"
    config.write_text(tiny_config.read_text()
                      + '[[hooks]]\nref = "distgrad.launch.hooks:grad_norm"\n')
    overrides = ["world.workers=3", "pipeline.micro_batches=2", "pipeline.schedule=1f1b",
                 "world.transport=tcp"]
    launch = launcher(config, *overrides, "--trace", "trace.json", "--show", "0")
    assert launch.wait() == 0, launch.output
    assert launch.losses() == reference(config, overrides)
    steps = [r for r in launch.metrics() if "loss" in r]
    assert all(r[f"grad_norm.stage{k}"] > 0 for r in steps for k in range(3))
    assert "1:worker1 |" not in launch.output and "0:coordinator |" in launch.output
    trace = json.loads((tmp_path / "trace.json").read_text())["traceEvents"]
    names = {e["pid"]: e["args"]["name"] for e in trace if e["name"] == "process_name"}
    assert names == {0: "0:coordinator", 1: "1:worker1 (stage 0)", 2: "2:worker2 (stage 1)",
                     3: "3:worker3 (stage 2)"}
    spans = {(e["pid"], e["name"]) for e in trace if e["ph"] == "X"}
    for stage in (1, 2, 3):
        assert {(stage, "forward"), (stage, "backward"), (stage, "optimizer step")} <= spans
    sends = {e["id"]: e for e in trace if e["ph"] == "s"}
    receipts = {e["id"]: e for e in trace if e["ph"] == "f"}
    assert len(sends) == len(receipts) > 6 * 2 * 4   # activations and gradients, 2 per step
    for ident, receipt in receipts.items():
        assert receipt["ts"] >= sends[ident]["ts"] and receipt["pid"] != sends[ident]["pid"]


@STRATEGIES
def test_resume_reproduces_an_uninterrupted_run(launcher, tiny_config, strategy):
    first = launcher(tiny_config, *strategy, "run.steps=4", "checkpoint.every=2")
    assert first.wait() == 0, first.output
    run_dir = first.run_dir
    assert ckpt.latest(run_dir)[1]["step"] == 4
    second = launcher(tiny_config, *strategy, "run.steps=8", "checkpoint.every=2", "--resume",
                      "--run-dir", run_dir)
    assert second.wait() == 0, second.output
    assert "steps 5..8, resumed from" in second.output
    uninterrupted = reference(tiny_config, strategy, steps=8)
    assert second.losses() == uninterrupted                     # bit for bit
    assert [r["step"] for r in second.metrics() if "loss" in r] == list(range(1, 9))


@STRATEGIES
def test_a_killed_worker_stops_the_run_and_leaves_its_checkpoint(launcher, tiny_config,
                                                                 strategy):
    launch = launcher(tiny_config, *strategy, "run.steps=100000", "checkpoint.every=3",
                      "run.log_every=1000")
    code, took, pids = kill_mid_run(launch, rank=2, after_steps=7)
    assert code == 128 + signal.SIGKILL, launch.output
    assert took < 5
    assert "FAILED: worker2 (rank 2, stage 1) was killed by SIGKILL at step" in launch.output
    assert_all_gone(pids.values())
    directory, manifest = ckpt.latest(launch.run_dir)
    assert manifest["step"] >= 6 and manifest["step"] % 3 == 0
    for stage in (0, 1):  # complete and loadable (resuming from one: the test above)
        state = distgrad.load(ckpt.stage_path(directory, stage))
        assert state["step"] == manifest["step"] and state["optimizer"]["state"]


@STRATEGIES
def test_ctrl_c_checkpoints_at_a_step_boundary_and_leaves_no_process(launcher, tiny_config,
                                                                     strategy):
    # (autograd: the steps in flight when the signal comes complete before the checkpoint)
    launch = launcher(tiny_config, *strategy, "run.steps=100000", "run.log_every=1000")
    launch.wait_for_steps(3)
    pids = launch.pids()
    launch.proc.send_signal(signal.SIGINT)
    assert launch.wait() == 128 + signal.SIGINT, launch.output
    assert_all_gone(pids.values())
    result = json.loads((launch.run_dir / "result.json").read_text())
    assert result["status"] == "stopped"
    stopped_at = result["step"]
    assert ckpt.latest(launch.run_dir)[1]["step"] == stopped_at == launch.losses().__len__()
    assert f"stopped by SIGINT at step {stopped_at}; last checkpoint: step {stopped_at}" \
        in launch.output


@STRATEGIES
def test_a_stopped_worker_is_detected_within_the_heartbeat_bound(launcher, tiny_config,
                                                                 strategy):
    launch = launcher(tiny_config, *strategy, "run.steps=100000", "run.log_every=1000",
                      DETECT_FAST)
    launch.wait_for_steps(3)
    pids = launch.pids()
    os.kill(pids[1], signal.SIGSTOP)
    t0 = time.monotonic()
    code = launch.wait()
    took = time.monotonic() - t0
    assert code == 1, launch.output
    assert "FAILED: worker1 (rank 1, stage 0) stopped answering (its process was stopped" \
        in launch.output
    # the heartbeat bound (2 s) plus reaction and teardown: far below the 30 s RPC timeout
    # that a missed detection would take (generous, for a loaded machine)
    assert took < 15, took
    assert_all_gone(pids.values())


def test_two_launches_at_once_do_not_collide(launcher, tiny_config):
    a, b = launcher(tiny_config), launcher(tiny_config, "world.transport=tcp")
    assert a.wait() == 0, a.output
    assert b.wait() == 0, b.output
    assert a.run_dir != b.run_dir and a.losses() == b.losses() == reference(tiny_config)


@STRATEGIES
def test_an_exception_on_a_worker_names_it_the_step_and_the_traceback(
        launcher, tiny_config, tmp_path, strategy):
    (tmp_path / "faulty.py").write_text(FAULTY)
    launch = launcher(tiny_config, *strategy, 'model.factory="faulty:model"',
                      "model.kwargs={at = 4}")
    assert launch.wait() == 1, launch.output
    out = launch.output
    assert "FAILED: worker2 (rank 2, stage 1) failed: ZeroDivisionError: trap sprung at " \
           "call 4 at step 4" in out
    assert "root cause:" in out and "faulty.py" in out and "Traceback" in out


@STRATEGIES
def test_an_evaluation_sees_the_parameters_of_its_own_step(launcher, tiny_config, strategy):
    # with steps sent ahead (run.in_flight, the default 2) an evaluation used to run
    # after the next step: the same run with nothing sent ahead is the reference
    runs = [launcher(tiny_config, *strategy, "run.eval_every=2", f"run.in_flight={n}")
            for n in (1, 8)]
    evals = []
    for launch in runs:
        assert launch.wait() == 0, launch.output
        evals.append([(r["step"], r["eval_loss"]) for r in launch.metrics() if "eval_loss" in r])
    assert [step for step, _ in evals[0]] == [2, 4, 6]
    assert evals[0] == evals[1]   # bit for bit


def test_a_step_that_raises_in_a_run_of_steps_is_named(launcher, tiny_config, tmp_path):
    # 12 steps of a few ms each: after the first, a command carries several of them
    (tmp_path / "faulty.py").write_text(FAULTY)
    launch = launcher(tiny_config, 'model.factory="faulty:model"', "model.kwargs={at = 9}",
                      "run.steps=12")
    assert launch.wait() == 1, launch.output
    assert "FAILED: worker2 (rank 2, stage 1) failed: ZeroDivisionError: trap sprung at " \
           "call 9 at step 9" in launch.output
    assert json.loads((launch.run_dir / "failure.json").read_text())["step"] == 9
    # the steps of commands that completed are logged; the failed command's are not
    losses = launch.losses()
    assert losses == reference(tiny_config, ["run.steps=12"])[:len(losses)] and len(losses) < 9


def test_a_worker_exit_status_is_the_launch_status_and_restarts_resume(
        launcher, tiny_config, tmp_path):
    (tmp_path / "faulty.py").write_text(FAULTY)
    crash = ['model.factory="faulty:model"', "checkpoint.every=2", "run.steps=8"]
    dies = launcher(tiny_config, *crash, "model.kwargs={at = 5, exit_code = 3}")
    assert dies.wait() == 3, dies.output
    assert "FAILED: worker2 (rank 2, stage 1) exited with status 3 at step 5" in dies.output
    once = f'model.kwargs={{at = 5, exit_code = 3, once = "{tmp_path / "crashed"}"}}'
    restarts = launcher(tiny_config, *crash, "run.max_restarts=1", once)
    assert restarts.wait() == 0, restarts.output
    # from step 4, or 2 when the crash came before the manifest of step 4 was written
    assert re.search(r"exited with status 3 at step 5; restart 1 of 1 from step [24]\n",
                     restarts.output), restarts.output
    sys.path.insert(0, str(tmp_path))
    try:
        expected = reference(tiny_config, crash + [once])  # the marker exists: no trap
    finally:
        sys.path.remove(str(tmp_path))
    assert restarts.losses() == expected


@pytest.mark.slow
def test_under_torchrun_every_rank_runs_its_own_launcher(tiny_config, tmp_path, request):
    """torchrun's agent holds MASTER_PORT: rank 0 publishes its rendezvous in the agent's
    store. Costs ~18 s of CPU (every rank imports torch): runs with ``-m slow`` only."""
    if "slow" not in (request.config.getoption("markexpr") or ""):
        pytest.skip("about 18 s of CPU: run with -m slow")
    pytest.importorskip("torch")
    import subprocess
    from launch_support import ROOT
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        p for p in (ROOT, os.environ.get("PYTHONPATH")) if p))
    done = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "3",
         "-m", "distgrad", "launch", str(tiny_config), "--no-progress", "--no-plot"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=100)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "torchrun launch, rank 0 of 3" in done.stdout
    (run_dir,) = (tmp_path / "runs").iterdir()
    losses = [json.loads(line)["loss"] for line in (run_dir / "metrics.jsonl").open()
              if '"loss"' in line]
    assert losses == reference(tiny_config)


def test_each_stage_offloads_its_activations_and_trains_the_same(launcher, tiny_config,
                                                                 tmp_path):
    config = tmp_path / "offloaded.toml"
    config.write_text(tiny_config.read_text() + '[offload]\nkind = "disk"\n'
                      f'directory = "{tmp_path}"\n[offload.policy]\nmin_bytes = 0\n')
    launch = launcher(config, "--trace", "trace.json")
    assert launch.wait() == 0, launch.output
    assert launch.losses() == reference(tiny_config)  # bit for bit, offloaded or not
    assert not list(tmp_path.glob("distgrad-offload-*"))  # each stage removed its directory
    # the trace shows offloaded activations written and read back, in the stages' lanes.
    # Which stage does which I/O depends on timing: a read served while its write is still
    # queued, or a record freed before it was written, costs no I/O and draws nothing; on a
    # loaded machine the last stage, whose backward follows its forward at once, may draw
    # nothing at all
    trace = json.loads((tmp_path / "trace.json").read_text())["traceEvents"]
    io = [e for e in trace if e["ph"] == "X" and e["name"].startswith("offload ")]
    assert {e["name"] for e in io} == {"offload write", "offload read"}
    assert {e["pid"] for e in io} <= {1, 2}  # pids 1 and 2: the two stages
    assert all(e["args"]["bytes"] > 0 for e in io)


#: a model whose layers each add a copy of their output that went through float32's
#: subnormal range and back (factors float32 holds; detached, so that the backward, which
#: multiplies in the other order, does not overflow): about x where subnormals are kept,
#: x / 2 where they are flushed, so every stage's setting shows in the losses
SUBNORMAL_DETOUR = '''
from distgrad import nn
from distgrad.launch.models import mlp


class Detour(nn.Module):
    def forward(self, x):
        return (x + x.detach() * 2.0 ** -70 * 2.0 ** -70 * 2.0 ** 70 * 2.0 ** 70) * 0.5


def model():
    return nn.Sequential(*[m for layer in mlp([2, 8, 8, 2]) for m in (layer, Detour())])
'''


@STRATEGIES
def test_flush_denormal_makes_every_process_flush_as_one_process_does(
        launcher, tiny_config, tmp_path, monkeypatch, strategy):
    (tmp_path / "detour.py").write_text(SUBNORMAL_DETOUR)
    monkeypatch.syspath_prepend(str(tmp_path))  # the reference imports it here too
    model = ['model.factory="detour:model"', "model.kwargs={}"]
    launch = launcher(tiny_config, *strategy, *model, "world.flush_denormal=true")
    assert launch.wait() == 0, launch.output
    flushed = reference(tiny_config, [*model, "world.flush_denormal=true"])
    kept = reference(tiny_config, model)
    assert flushed != kept  # the setting changes this model's arithmetic
    assert launch.losses() == flushed  # bit for bit: the coordinator and both stages flushed
    assert float((distgrad.tensor([1e-39]) * 1.0)[0]) > 0  # the reference put this thread back

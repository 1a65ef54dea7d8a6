"""The launcher's parts without processes: schedules, the stage split, scheduler
environments, the command line."""
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from distgrad.launch.environment import detect, first_host, slurm_port
from distgrad.launch.resolve import even_balance
from distgrad.launch.schedule import SCHEDULES

pytestmark = pytest.mark.timeout(60)

ROOT = str(Path(__file__).resolve().parents[2])


@pytest.mark.parametrize("name", sorted(SCHEDULES))
@pytest.mark.parametrize("stages, micro", [(1, 1), (2, 1), (2, 4), (4, 3), (4, 8)])
def test_schedules_are_complete_and_causal(name, stages, micro):
    for stage in range(stages):
        order = SCHEDULES[name](stage, stages, micro)
        assert sorted(order) == sorted([("F", i) for i in range(micro)]
                                       + [("B", i) for i in range(micro)])
        assert [i for k, i in order if k == "B"] == list(range(micro))  # accumulation order
        for i in range(micro):
            assert order.index(("F", i)) < order.index(("B", i))


def test_1f1b_holds_at_most_stages_minus_stage_micro_batches():
    for stage in range(4):
        live = peak = 0
        for kind, _ in SCHEDULES["1f1b"](stage, 4, 8):
            live += 1 if kind == "F" else -1
            peak = max(peak, live)
        assert peak == 4 - stage
    assert max(sum(1 for k, _ in SCHEDULES["gpipe"](0, 4, 8)[:i] if k == "F")
               for i in range(17)) == 8


def test_even_balance_minimises_the_largest_stage():
    assert even_balance([10, 0, 10, 0, 10, 0, 2], 2) == [4, 3]
    assert even_balance([1, 0, 100, 0, 1, 0, 1], 2) == [4, 3]
    assert even_balance([5] * 8, 4) == [2, 2, 2, 2]
    assert even_balance([5, 0, 5], 3) == [1, 1, 1]          # fewer weighted layers than stages
    for sizes, stages in [([3, 1, 4, 1, 5, 9, 2, 6], 3), ([7, 0, 0, 1, 8, 0, 2], 2)]:
        balance = even_balance(sizes, stages)
        assert sum(balance) == len(sizes) and len(balance) == stages and min(balance) > 0


def test_slurm_and_torchrun_environments():
    assert first_host("node[07-09,12],gpu01") == "node07"
    assert first_host("localhost") == "localhost"
    assert slurm_port("123456") == 18456
    slurm = detect(2, {"SLURM_PROCID": "2", "SLURM_NTASKS": "3", "SLURM_JOB_ID": "42",
                       "SLURM_JOB_NODELIST": "localhost", "SLURM_LOCALID": "2",
                       "SLURM_STEP_ID": "0"})
    assert (slurm.kind, slurm.world_size, slurm.ranks) == ("slurm", 3, [2])
    # the first host by name: each process resolves it (and its own address toward it)
    assert slurm.rendezvous == "tcp://localhost:15042" and slurm.run_id == "slurm42"
    env = detect(1, {"RANK": "1", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1",
                     "MASTER_PORT": "29511"})
    assert (env.kind, env.ranks, env.rendezvous) == ("env", [1], "tcp://127.0.0.1:29511")
    agent = detect(1, {"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1",
                       "MASTER_PORT": "29511", "TORCHELASTIC_USE_AGENT_STORE": "True",
                       "TORCHELASTIC_RUN_ID": "abc"})
    assert agent.kind == "torchrun" and agent.rendezvous is None and agent.run_id == "abc"
    assert detect(2, {"RANK": "1"}, force_local=True).kind == "local"
    assert detect(2, {}).ranks == [0, 1, 2]
    with pytest.raises(ValueError, match="MASTER_ADDR/MASTER_PORT"):
        detect(1, {"RANK": "0", "WORLD_SIZE": "2"})


def _distgrad(*args, cwd=None):
    env = dict(os.environ, PYTHONPATH=ROOT)
    return subprocess.run([sys.executable, "-m", "distgrad", *args], capture_output=True,
                          text=True, env=env, cwd=cwd, timeout=60)


def test_help_describes_every_option_with_default_and_environment():
    top = _distgrad("--help")
    assert top.returncode == 0 and "launch" in top.stdout and "train a model" in top.stdout
    text = " ".join(_distgrad("launch", "--help").stdout.split())
    for words in ("KEY=VALUE", "--resume", "env: DISTGRAD_RESUME=1", "--trace FILE",
                  "env: DISTGRAD_TRACE", "--show RANKS", "default: every rank",
                  "--run-dir DIR", "env: DISTGRAD_RUN_DIR", "--check", "--help-config"):
        assert words in text, words
    keys = _distgrad("launch", "x.toml", "--help-config").stdout
    assert "[pipeline]" in keys and "micro_batches" in keys and "[[hooks]]" in keys


def test_check_prints_the_resolved_config_and_errors_start_nothing(tmp_path):
    config = Path(ROOT) / "configs" / "quickstart.toml"
    ok = _distgrad("launch", config, "world.workers=3", "--check", cwd=tmp_path)
    assert ok.returncode == 0, ok.stderr
    assert json.loads(ok.stdout)["world"]["workers"] == 3 and "3 stages" in ok.stderr
    bad = _distgrad("launch", config, "optim.lr=fast", cwd=tmp_path)
    assert bad.returncode == 2 and bad.stderr.startswith(
        "distgrad launch: error: command line override 'optim.lr=fast': optim.lr: Adam "
        "(lr = 'fast'): ")
    typo = tmp_path / "typo.toml"
    typo.write_text(config.read_text().replace("[optim]", "[optim]\nlearning_rate = 1"))
    bad = _distgrad("launch", typo, cwd=tmp_path)
    line = typo.read_text().splitlines().index("learning_rate = 1") + 1
    assert bad.returncode == 2 and f"typo.toml:{line}: optim.learning_rate:" in bad.stderr
    assert not (tmp_path / "runs").exists()   # nothing started, nothing written


def _launch_configs():
    """The shipped configs of ``distgrad launch`` (not the offloading experiments' ones,
    which ``distgrad offload`` reads: they have an [experiment] table)."""
    return sorted(p.name for p in (Path(ROOT) / "configs").glob("*.toml")
                  if not any(line.strip() == "[experiment]"
                             for line in p.read_text().splitlines()))


@pytest.mark.parametrize("config", _launch_configs())
def test_every_shipped_config_checks(config, tmp_path):
    result = _distgrad("launch", Path(ROOT) / "configs" / config, "--check", cwd=tmp_path)
    assert result.returncode == 0, result.stderr


def test_the_loss_curve_or_a_one_line_note(tmp_path, monkeypatch):
    from distgrad.launch.console import hook_series, plot_loss
    records = [{"step": i, "loss": 1.0 / i, "act_std.stage0": i, "act_std.stage1": 2 * i}
               for i in range(1, 20)]
    records.append({"step": 19, "eval_loss": 0.1})
    assert hook_series(records[:2]) == {"act_std": {"stage0": [(1, 1), (2, 2)],
                                                    "stage1": [(1, 2), (2, 4)]}}
    if importlib.util.find_spec("matplotlib") is not None:
        path, note = plot_loss(str(tmp_path), records)
        assert note is None and Path(path).read_bytes()[:4] == b"\x89PNG"
    monkeypatch.setitem(sys.modules, "matplotlib", None)   # as if not installed
    path, note = plot_loss(str(tmp_path), records)
    assert path is None and note == ("no loss curve: matplotlib is not installed "
                                     "(pip install 'distgrad[launch]')")


def test_hooks_log_and_clip_a_stage_gradients():
    import distgrad
    from distgrad.launch.hooks import clip_grad_norm, grad_norm
    layer = distgrad.nn.Linear(3, 2)
    layer(distgrad.ones(4, 3)).pow(2).sum().mul(10).backward()
    before = grad_norm(layer)["grad_norm"]
    assert clip_grad_norm(layer, max_norm=1.0)["grad_norm"] == pytest.approx(before, rel=1e-5)
    assert grad_norm(layer)["grad_norm"] == pytest.approx(1.0, rel=1e-5)


def test_epochs_count_steps_from_the_training_split(tmp_path):
    from distgrad.launch.config import load_config
    from distgrad.launch.coordinator import Coordinator
    text = (Path(ROOT) / "configs" / "quickstart.toml").read_text()
    path = tmp_path / "epochs.toml"
    path.write_text("\n".join(line for line in text.splitlines()
                              if not line.startswith("steps =")))  # epochs instead
    config = load_config(path, ["run.epochs=3", "data.kwargs={n = 1000}", "data.batch_size=100"])
    coordinator = Coordinator(str(tmp_path), {"config": config, "world": {"workers": ["a", "b"]}})
    assert coordinator.batches.steps_per_epoch == 8 and coordinator.total == 24  # 800 train


@pytest.mark.parametrize("replicas", [1, 2, 3])
def test_replica_shards_are_distributed_sampler_batches_of_the_whole_batch(replicas):
    import numpy as np
    import distgrad
    from distgrad.launch.data import Batches
    from distgrad.utils.data import DataLoader, DistributedSampler, TensorDataset
    n, batch = 101, 12
    x = np.arange(n, dtype=np.float32)[:, None] * np.ones((1, 2), np.float32)
    y = np.arange(n)
    batches = Batches((x, y), batch, seed=7, replicas=replicas)
    assert batches.steps_per_epoch == n // batch
    data = TensorDataset(distgrad.from_numpy(x), distgrad.from_numpy(y))
    for epoch in (0, 1):
        for rank in range(replicas):  # what each rank of a torch-style DDP program loads
            sampler = DistributedSampler(data, num_replicas=replicas, rank=rank, seed=7,
                                         drop_last=True)
            sampler.set_epoch(epoch)
            loader = DataLoader(data, batch_size=batch // replicas, sampler=sampler)
            for k, (_, yb) in zip(range(batches.steps_per_epoch), loader):
                step = epoch * batches.steps_per_epoch + k
                assert batches.shards(step)[rank][1].tolist() == yb.tolist()
        for k in range(batches.steps_per_epoch):  # together: the one-process batch
            step = epoch * batches.steps_per_epoch + k
            whole = sorted(batches.batch(step)[1].tolist())
            assert sorted(sum((s[1].tolist() for s in batches.shards(step)), [])) == whole
    assert len(set(batches.batch(0)[1].tolist()) & set(batches.batch(1)[1].tolist())) == 0


def test_the_grid_places_workers_replica_by_replica():
    from distgrad.launch.grid import Grid
    grid = Grid(6, 2)
    assert grid.stages == 3 and [grid.place(w) for w in range(6)] == [
        (0, 0), (0, 1), (0, 2), (1, 0), (1, 1), (1, 2)]
    assert grid.stage_peers(1) == [1, 4] and grid.index(1, 2) == 5
    assert [Grid(3, 1).describe(2), Grid(3, 3).describe(2), grid.describe(4)] == [
        "stage 2", "replica 2", "stage 1, replica 1"]


def test_a_command_carries_about_20_ms_of_steps_and_one_until_the_step_time_is_known():
    from distgrad.launch import progress
    size = progress.CommandSize()
    assert size.steps() == 1
    size.observe(10, 0.010)            # 1 ms a step
    assert size.steps() == 20
    size.observe(4, 1e-5)              # a tiny model: bounded
    assert size.steps() == progress.MAX_STEPS_PER_COMMAND
    size.observe(2, 1.0)               # a large one: one step per command
    assert size.steps() == 1
    size.observe(0, 0.0)               # nothing measured: nothing learned
    assert size.steps() == 1
    heavy = progress.CommandSize(bytes_per_step=progress.MAX_COMMAND_BYTES // 3)
    heavy.observe(10, 0.001)           # fast steps, but 16 MB of data at most
    assert heavy.steps() == 3
    assert progress.CommandSize(bytes_per_step=1 << 30).steps() == 1


def test_a_failure_notice_names_a_worker_and_a_step_or_is_refused():
    from distgrad.launch import progress
    notices = progress.FailedSteps(workers=2)
    assert notices.take(1, timeout=0) is None
    notices.put(1, 7)
    assert notices.take(1, timeout=0) == 7 and notices.take(1, timeout=0) is None
    for worker, step in [(2, 1), (-1, 1), ("0", 1), (0, 1.5), (0, None)]:
        with pytest.raises(ValueError, match="malformed failure notice"):
            notices.put(worker, step)

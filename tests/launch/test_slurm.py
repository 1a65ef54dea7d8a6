"""``distgrad launch`` as Slurm tasks: ``srun -n 3`` on a cluster that answers.

Runs where ``srun`` is on PATH and a controller answers ``sinfo`` (for example
inside ``scripts/slurm_smoke.sh``, or on a login node); skipped otherwise.
"""
import os
import shutil
import subprocess
import sys

import pytest

pytest.importorskip("zmq")

from launch_support import ROOT  # noqa: E402

pytestmark = [pytest.mark.slurm, pytest.mark.timeout(180)]


def _cluster_answers():
    if shutil.which("srun") is None:
        return "srun is not on PATH"
    try:
        done = subprocess.run(["sinfo", "-h"], capture_output=True, timeout=15)
    except (OSError, subprocess.TimeoutExpired):
        return "sinfo did not answer"
    return None if done.returncode == 0 else "no Slurm controller answers sinfo"


@pytest.mark.parametrize("strategy", [[], ["world.strategy=autograd"]],
                         ids=["pipeline", "autograd"])
def test_srun_three_tasks_train_the_pipeline(tiny_config, tmp_path, strategy):
    reason = _cluster_answers()
    if reason:
        pytest.skip(reason)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        p for p in (ROOT, os.environ.get("PYTHONPATH")) if p))
    done = subprocess.run(
        ["srun", "--ntasks=3", "--overcommit", "--kill-on-bad-exit=1", "--immediate=60",
         sys.executable, "-m", "distgrad", "launch", str(tiny_config), *strategy,
         "--no-progress", "--no-plot"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=150)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "slurm launch" in done.stdout
    run_dirs = list((tmp_path / "runs").iterdir())
    assert len(run_dirs) == 1 and run_dirs[0].name.startswith("tiny-slurm")
    assert sorted(p.name for p in (run_dirs[0] / "logs").iterdir()) == [
        "0-coordinator.log", "1-worker1.log", "2-worker2.log"]
    assert (run_dirs[0] / "result.json").exists()

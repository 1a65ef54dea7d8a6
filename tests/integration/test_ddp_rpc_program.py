"""A program that combines DDP with the RPC framework (``ddp_remote_embedding_program.py``,
written against torch) runs on distgrad under ``python -m distgrad.compat.as_torch``
(``torch`` is distgrad there and in the processes it spawns): DDP averages the dense head's
gradients inside distributed autograd contexts, so the two trainers' replicas stay
identical while the loss falls."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from distgrad.utils.ports import free_port

pytestmark = pytest.mark.timeout(120)

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]


def test_ddp_with_remote_embedding_runs_unchanged_with_torch_aliased(tmp_path):
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.Popen([sys.executable, "-m", "distgrad.compat.as_torch",
                             str(HERE / "ddp_remote_embedding_program.py"), str(tmp_path),
                             str(free_port()), str(free_port()), "3"], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        out, _ = proc.communicate(timeout=90)
    finally:
        if proc.poll() is None:  # the spawned ranks die with their parent (PDEATHSIG)
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, out
    assert "trainer0: epoch 2 done" in out and "trainer1: epoch 2 done" in out, out
    runs = [json.loads((tmp_path / f"trainer{r}.json").read_text()) for r in (0, 1)]
    # the dense replicas got the same averaged gradients at every step
    assert runs[0]["head"] == runs[1]["head"]
    for run in runs:  # the same 4 batches each epoch: the last epoch's loss is lower
        losses = run["losses"]
        assert len(losses) == 12
        assert sum(losses[-4:]) < sum(losses[:4]), losses


def test_the_alias_reaches_distgrad_not_torch(tmp_path):
    from distgrad.compat import as_torch
    env = as_torch.child_environment(dict(os.environ, PYTHONPATH=str(ROOT)))
    code = ("import torch, torch.distributed as dist, torch.nn.parallel as par; "
            "print(torch.__name__, dist.__name__, par.DistributedDataParallel.__module__)")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         timeout=60)
    assert out.stdout.split() == ["distgrad", "distgrad.distributed",
                                  "distgrad.nn.parallel.distributed"], out.stderr

"""The same torch.distributed.pipelining program (``programs/pp_schedules.py``: every
schedule, a CSV order, eval) under torchrun on PyTorch with gloo and under distgrad's
torchrun with ``import torch`` swapped for distgrad: each rank's gradients, losses and
outputs agree to float32 tolerance. Without torch installed only the distgrad run
happens (it must finish and give finite numbers)."""
import importlib.util
import json
import math
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("zmq")

pytestmark = pytest.mark.timeout(240)

ROOT = Path(__file__).resolve().parents[3]
PROGRAM = Path(__file__).resolve().parent / "programs" / "pp_schedules.py"


def _run(torch):
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore")
    env.pop("DISTGRAD_AS_TORCH", None)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT)] + [p for p in env.get("PYTHONPATH", "")
                                                       .split(os.pathsep) if p])
    for var in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "LOCAL_RANK"):
        env.pop(var, None)
    runner = [] if torch else ["-m", "distgrad.compat.as_torch"]
    cmd = [sys.executable, *runner, "-m", "torch.distributed.run", "--standalone",
           "--nproc-per-node", "2", str(PROGRAM)]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=180)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 0, f"{'torch' if torch else 'distgrad'} run failed:\n{err[-4000:]}"
    results = [json.loads(line[len("RESULT "):]) for line in out.splitlines()
               if line.startswith("RESULT ")]
    return {r["rank"]: r["results"] for r in results}


def _close(a, b, path):
    if isinstance(a, dict):
        assert set(a) == set(b), path
        for k in a:
            _close(a[k], b[k], f"{path}.{k}")
    elif isinstance(a, list):
        assert len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b)):
            _close(x, y, f"{path}[{i}]")
    else:
        assert math.isclose(a, b, rel_tol=2e-4, abs_tol=2e-5), f"{path}: {a} vs {b}"


def _finite(value):
    if isinstance(value, dict):
        return all(_finite(v) for v in value.values())
    if isinstance(value, list):
        return all(_finite(v) for v in value)
    return math.isfinite(value)


def test_the_same_program_on_pytorch_and_on_distgrad():
    ours = _run(torch=False)
    assert sorted(ours) == [0, 1] and _finite(ours)
    assert len(ours[1]["GPipe"]["losses"]) == 4
    if importlib.util.find_spec("torch") is None:
        pytest.skip("torch is not installed: the distgrad run alone passed")
    _close(_run(torch=True), ours, "rank")

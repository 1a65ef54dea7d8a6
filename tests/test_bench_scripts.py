"""The benchmark scripts run where PyTorch is absent (its columns read n/a): they are not
timed here, only run once on their smallest case."""
import json
import os
import pathlib
import subprocess
import sys

import pytest

pytestmark = pytest.mark.timeout(120)

SCRIPTS = pathlib.Path(__file__).resolve().parents[1] / "scripts"


def _run_without_torch(tmp_path, script, *args):
    shim = tmp_path / "no_torch"
    shim.mkdir()
    (shim / "torch.py").write_text('raise ImportError("PyTorch hidden by the test")\n')
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(shim)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]))
    proc = subprocess.run([sys.executable, str(SCRIPTS / script), *args], env=env,
                          capture_output=True, text=True, timeout=100)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def test_bench_layers_prints_na_without_torch(tmp_path):
    out = _run_without_torch(tmp_path, "bench_layers.py", "--reps", "1",
                             "--case", "lenet5_b64_32x32")
    row = next(line for line in out.splitlines() if line.startswith("lenet5"))
    assert row.split()[2:4] == ["n/a", "n/a"]
    report = json.loads(out.strip().splitlines()[-1])
    assert report["rows"][0]["torch_ms"] is None and report["rows"][0]["distgrad_ms"] > 0


def test_bench_pipelining_runs_a_schedule_without_torch(tmp_path):
    out = _run_without_torch(tmp_path, "bench_pipelining.py", "--quick", "--schedule", "GPipe",
                             "--micro", "2", "--launch", "")
    report = json.loads(out.strip().splitlines()[-1])
    assert [r["what"] for r in report["rows"]] == ["one process, 1 BLAS thread",
                                                   "one process, 2 BLAS threads",
                                                   "GPipe, 2 micro-batches"]
    gpipe = report["rows"][2]
    assert gpipe["rate"] > 0 and 0 <= gpipe["bubble"] < 1 and \
        gpipe["bubble_textbook"] == pytest.approx(1 / 3)

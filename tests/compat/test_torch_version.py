"""What distgrad reports as torch's version under as_torch, and ``torch.version``."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

from distgrad.compat import as_torch
from distgrad.compat.torch_version import TORCH_RELEASE, TorchVersion

pytestmark = pytest.mark.timeout(120)

ROOT = Path(__file__).resolve().parents[2]
OPERANDS = ["2.0", "2.13", TORCH_RELEASE, f"{TORCH_RELEASE}+cpu", "2.14.0.dev20240101",
            f"{TORCH_RELEASE}rc1", (2, 13), (2, 14), (1, 8, 1), "3", "1.13.1"]


def test_the_release_is_the_one_the_suite_compares_against():
    torch = pytest.importorskip("torch")
    assert torch.__version__.split("+")[0] == TORCH_RELEASE


def test_comparisons_behave_as_torchs_torchversion():
    theirs = pytest.importorskip("torch.torch_version").TorchVersion
    for version in (f"{TORCH_RELEASE}+cpu", "2.1.0", "1.13.1"):
        ours_v, theirs_v = TorchVersion(version), theirs(version)
        for other in OPERANDS:
            assert [ours_v < other, ours_v <= other, ours_v > other, ours_v >= other,
                    ours_v == other] == [theirs_v < other, theirs_v <= other, theirs_v > other,
                                         theirs_v >= other, theirs_v == other], (version, other)


def test_under_as_torch_torch_reports_the_release_and_has_a_version_module(tmp_path):
    program = tmp_path / "prog.py"
    program.write_text(
        "import torch, torch.version\n"
        "from torch.torch_version import TorchVersion\n"
        "print(torch.__version__, isinstance(torch.__version__, TorchVersion),\n"
        "      torch.__version__ >= '2.0', torch.version.cuda, torch.version.__version__ ==\n"
        "      torch.__version__)\n")
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    env.pop(as_torch.ENV_FLAG, None)
    done = subprocess.run([sys.executable, "-m", "distgrad.compat.as_torch", str(program)],
                          env=env, capture_output=True, text=True, timeout=90)
    assert done.returncode == 0, done.stderr
    version, *rest = done.stdout.split()
    assert version.startswith(f"{TORCH_RELEASE}+distgrad.")
    assert rest == ["True", "True", "None", "True"]


def test_python_dash_m_torch_submodule_runs_distgrads_module_as_main(tmp_path):
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    env.pop(as_torch.ENV_FLAG, None)
    done = subprocess.run([sys.executable, "-m", "distgrad.compat.as_torch", "-m",
                           "torch.distributed.run", "--help"], env=env, capture_output=True,
                          text=True, timeout=90, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    # distgrad's run.py (PyTorch's would fail here: distgrad stands in for torch)
    assert done.stdout.startswith("usage: run.py") and "--rdzv-backend" in done.stdout
    assert "distgrad" in done.stdout

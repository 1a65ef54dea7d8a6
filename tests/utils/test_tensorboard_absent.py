"""distgrad.utils.tensorboard without the tensorboard package (the first CI pass has none)."""
import importlib.util
import os
import subprocess
import sys

import pytest


@pytest.mark.skipif(importlib.util.find_spec("tensorboard") is not None,
                    reason="the tensorboard package is installed: it wins over a directory")
def test_a_directory_named_tensorboard_is_not_taken_for_the_package(tmp_path):
    # A log directory called tensorboard in the working directory imports as an empty
    # namespace package; the writer must say the package is missing, not fail on a version.
    (tmp_path / "tensorboard").mkdir()
    proc = subprocess.run([sys.executable, "-c", "import distgrad.utils.tensorboard"],
                          cwd=tmp_path, env=dict(os.environ, PYTHONPATH=str(tmp_path)),
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0
    assert "ModuleNotFoundError" in proc.stderr
    assert "found only the directory" in proc.stderr
    assert "pip install 'distgrad[tensorboard]'" in proc.stderr

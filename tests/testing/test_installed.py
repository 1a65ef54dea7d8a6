"""A user's own test folder, outside the repository, with distgrad installed from its wheel
(not editable): the workers import the user's modules and run the test's own functions."""
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import distgrad

pytestmark = pytest.mark.timeout(180)

ROOT = Path(distgrad.__file__).resolve().parents[1]

MYLIB = '''
import distgrad

def scale(x, k=2):
    return x * k

def where():
    return distgrad.__file__

class Counter:
    def __init__(self, start=0):
        self.n = start

    def add(self, k=1):
        self.n += k
        return self.n
'''

TEST_MYLIB = '''
import pytest
import distgrad
from distgrad.distributed import rpc
import mylib

def offset(x):
    return x + 100

def test_scale_on_a_worker(rpc_world):
    rpc_world(2, allowed_modules=["mylib"])
    assert rpc.rpc_sync("worker1", mylib.scale, (3,)) == 6
    counter = rpc.remote("worker2", mylib.Counter, (5,))
    assert counter.rpc_sync().add(2) == 7
    assert rpc.rpc_sync("worker1", offset, (1,)) == 101   # the test module's own function
    assert rpc.rpc_sync("worker1", mylib.where) == distgrad.__file__

@pytest.mark.world(3)
def test_every_rank(rank, world_size):
    assert mylib.scale(rank) == 2 * rank
    assert rpc.rpc_sync(f"worker{(rank + 1) % world_size}", offset, (rank,)) == rank + 100
'''


def test_a_users_folder_with_distgrad_installed_from_its_wheel(tmp_path):
    # build the wheel from a copy (a build writes into its source tree) and install it
    src = tmp_path / "src"
    shutil.copytree(ROOT / "distgrad", src / "distgrad",
                    ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    site = tmp_path / "site"
    # without build isolation (no index needed): the test extra brings setuptools and wheel
    built = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps",
                            "--no-build-isolation", "--no-cache-dir", "--target", str(site),
                            str(src)], timeout=120, capture_output=True, text=True)
    assert built.returncode == 0, built.stdout + built.stderr
    assert (site / "distgrad" / "testing" / "pytest_plugin.py").exists()
    assert not (site / "workers").exists()   # no generic top-level package in site-packages
    user = tmp_path / "user"
    user.mkdir()
    (user / "mylib.py").write_text(MYLIB)
    (user / "test_mylib.py").write_text(TEST_MYLIB)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "DISTGRAD_"))}
    env["PYTHONPATH"] = str(site)   # this distgrad, not the repository's
    proc = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-n", "2",
                           "-q", "-W", "error::pytest.PytestUnknownMarkWarning"],
                          cwd=user, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "2 passed" in proc.stdout

"""Running ``distgrad launch`` as a user would, in a temp directory, reaping everything.

``launcher(*args)`` starts ``python -m distgrad launch ARGS --no-progress --no-plot``
(``progress=True``: with progress lines) with the temp directory as its working
directory and its output in a file; the fixture kills every launcher that is still
running when the test ends, and every process any launch recorded in
``processes*.json``, so a failing test leaves nothing behind either.
"""
import os
import subprocess
import sys
from pathlib import Path

import pytest

from launch_support import ROOT, TINY, Launch, kill_recorded


@pytest.fixture
def tiny_config(tmp_path):
    path = tmp_path / "tiny.toml"
    path.write_text(TINY)
    return path


@pytest.fixture
def launcher(tmp_path):
    started = []

    def start(*args, env=None, cwd=None, progress=False):
        cwd = Path(cwd or tmp_path)
        output = cwd / f"launch-{len(started)}.out"
        e = dict(os.environ)
        e["PYTHONPATH"] = os.pathsep.join(p for p in (ROOT, e.get("PYTHONPATH")) if p)
        for var in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "SLURM_PROCID"):
            e.pop(var, None)
        e.update(env or {})
        with open(output, "wb") as out:
            proc = subprocess.Popen(
                [sys.executable, "-m", "distgrad", "launch", *map(str, args), "--no-plot",
                 *([] if progress else ["--no-progress"])], cwd=cwd, stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL, env=e)
        launch = Launch(proc, cwd, output)
        started.append(launch)
        return launch

    yield start
    for launch in started:
        if launch.proc.poll() is None:
            launch.proc.kill()
            launch.proc.wait()
    kill_recorded(tmp_path)


@pytest.fixture(autouse=True)
def _slow_only_when_selected(request):
    """Tests marked slow run with ``-m slow`` only (pyproject.toml's marker)."""
    if request.node.get_closest_marker("slow") and \
            "slow" not in (request.config.getoption("markexpr") or ""):
        pytest.skip("marked slow: run with -m slow")

"""docs/multi-host-launch.md runs as written: each ```bash block is a script of its own
on simulated hosts (set aside where they cannot be made), as a reader would paste it."""
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from distgrad.testing import hosts as simulated

from launch_support import ROOT

pytestmark = pytest.mark.timeout(240)

GUIDE = Path(ROOT) / "docs" / "multi-host-launch.md"


def _blocks():
    return re.findall(r"```bash\n(.*?)```", GUIDE.read_text(), flags=re.S)


@pytest.mark.parametrize("index", range(len(_blocks())))
def test_the_guides_commands_run_on_simulated_hosts(index, tmp_path):
    why = simulated.unavailable()
    if why:
        pytest.skip(why)
    # its own name for the hosts (two tests at once must not share them), the repository's
    # configs where the guide expects them, its run directories in a temp directory
    block = _blocks()[index].replace("guide", f"guide{os.getpid()}")
    (tmp_path / "configs").symlink_to(Path(ROOT) / "configs")
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("SLURM_", "OMPI_", "PMI_", "TORCHELASTIC_"))
           and k not in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")}
    env["PATH"] = os.pathsep.join([os.path.dirname(sys.executable), env.get("PATH", "")])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (ROOT, env.get("PYTHONPATH")) if p)
    done = subprocess.run(["bash", "-e", "-c", block], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=230)
    out = done.stdout + done.stderr
    assert done.returncode == 0, out
    if "link set eth0 down" in block:
        assert re.search(r"FAILED: host host1 \(\S+\) is lost: worker2 \(rank 2\) stopped "
                         r"answering at step \d+", out), out
        assert "exit status 1" in out
    else:
        assert "finished at step 100" in out and '"host": "host1 (' in out
    assert f"guide{os.getpid()}" not in simulated.listed()

"""ipc socket directories of crashed processes are swept by the next process."""
import os
import subprocess
import sys

import pytest

from distgrad.utils.tempdirs import owned_tempdir, sweep_stale

pytestmark = pytest.mark.timeout(60)


def test_dead_owners_directories_are_swept(tmp_path):
    # A child makes a directory and dies without cleaning up, as a crash would.
    code = ("import sys; from distgrad.utils.tempdirs import owned_tempdir; "
            "print(owned_tempdir('dgtest-', sys.argv[1]))")
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True,
                         text=True, timeout=60, check=True).stdout.strip()
    assert os.path.isdir(out)
    mine = owned_tempdir("dgtest-", str(tmp_path))  # sweeps the dead child's directory
    assert not os.path.exists(out)
    assert os.path.isdir(mine)
    sweep_stale("dgtest-", str(tmp_path))  # never removes a live owner's directory
    assert os.path.isdir(mine)


def test_dead_owners_files_are_swept_too(tmp_path):
    code = "import os; print(os.getpid())"
    dead = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60, check=True).stdout.strip()
    stale = tmp_path / f"dgtest-{dead}-segment"
    stale.write_bytes(b"x")
    live = tmp_path / f"dgtest-{os.getpid()}-segment"
    live.write_bytes(b"x")
    sweep_stale("dgtest-", str(tmp_path))
    assert not stale.exists() and live.exists()

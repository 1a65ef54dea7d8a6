"""ipc socket directories of crashed processes are swept by the next process."""
import os
import subprocess
import sys

from distgrad.rpc.tempdirs import owned_tempdir, sweep_stale


def test_dead_owners_directories_are_swept(tmp_path):
    # A child makes a directory and dies without cleaning up, as a crash would.
    code = ("import sys; from distgrad.rpc.tempdirs import owned_tempdir; "
            "print(owned_tempdir('dgtest-', sys.argv[1]))")
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True,
                         text=True, timeout=60, check=True).stdout.strip()
    assert os.path.isdir(out)
    mine = owned_tempdir("dgtest-", str(tmp_path))  # sweeps the dead child's directory
    assert not os.path.exists(out)
    assert os.path.isdir(mine)
    sweep_stale("dgtest-", str(tmp_path))  # never removes a live owner's directory
    assert os.path.isdir(mine)

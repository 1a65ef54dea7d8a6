"""ipc socket directories of crashed processes are swept by the next process; those of a
program that ends without closing what made them go at its exit."""
import os
import subprocess
import sys

import pytest

from distgrad.utils.tempdirs import owned_tempdir, sweep_stale

pytestmark = pytest.mark.timeout(60)


def test_dead_owners_directories_are_swept(tmp_path):
    # A child makes a directory and dies without cleaning up, as a crash would.
    code = ("import os, sys; from distgrad.utils.tempdirs import owned_tempdir; "
            "print(owned_tempdir('dgtest-', sys.argv[1]), flush=True); os._exit(0)")
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


def test_a_program_that_just_ends_leaves_no_directory(tmp_path):
    # No rpc.shutdown() or destroy_process_group(): the interpreter's exit removes it. A
    # forked child that exits normally first must not remove its parent's directory.
    code = ("import os, sys; from distgrad.utils.tempdirs import owned_tempdir\n"
            "d = owned_tempdir('dgtest-', sys.argv[1])\n"
            "pid = os.fork()\n"
            "if pid == 0:\n"
            "    sys.exit(0)\n"
            "os.waitpid(pid, 0)\n"
            "print(d, os.path.isdir(d))\n")
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True,
                         text=True, timeout=60, check=True).stdout.split()
    assert out[1] == "True", "a forked child's exit removed its parent's directory"
    assert not os.path.exists(out[0])

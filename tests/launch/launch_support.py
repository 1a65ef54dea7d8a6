"""Helpers of the launch tests: a launch as a user runs it, and the checks on its processes."""
import glob
import json
import os
import signal
import subprocess
import time
from pathlib import Path

from distgrad.launch.config import load_config
from distgrad.launch.local import train_in_one_process
from distgrad.utils.tempdirs import pid_alive

ROOT = str(Path(__file__).resolve().parents[2])

# heartbeat_timeout: 10 s, since a 2-core machine at load 15 left healthy workers silent
# for 2 s (a false death); the tests of detection set 2 s themselves (DETECT_FAST).
# test_config counts this text's lines: keep them.
#: the override of the tests that time how fast a lost worker or host is found
DETECT_FAST = "world.heartbeat_timeout=2.0"

TINY = """\
# a pipeline small enough to start, train and stop in a couple of seconds
[run]
steps = 6
log_every = 2

[world]
workers = 2
heartbeat_timeout = 10.0
rpc_timeout = 30.0

[model]
factory = "mlp"
kwargs = { sizes = [2, 8, 8, 2] }

[data]
source = "spirals"
kwargs = { n = 256 }
batch_size = 32

[optim]
lr = 0.05
"""

#: a model module whose last layer raises (or exits) on a given call: failures on a worker
FAULTY = '''
import os

from distgrad import nn
from distgrad.launch.models import mlp


class Trap(nn.Module):
    """Passes its input through; on its ``at``-th call raises, or exits the process."""

    def __init__(self, at, exit_code=None, once=None):
        super().__init__()
        self.at, self.exit_code, self.once, self.calls = at, exit_code, once, 0

    def forward(self, x):
        self.calls += 1
        if self.calls == self.at and not (self.once and os.path.exists(self.once)):
            if self.once:
                open(self.once, "w").close()
            if self.exit_code is not None:
                os._exit(self.exit_code)
            raise ZeroDivisionError(f"trap sprung at call {self.calls}")
        return x


def model(at, exit_code=None, once=None):
    return nn.Sequential(*mlp([2, 8, 8, 2]), Trap(at, exit_code, once))
'''


class Launch:
    def __init__(self, proc, cwd, output):
        self.proc, self.cwd, self.output_path = proc, Path(cwd), output

    @property
    def output(self):
        return Path(self.output_path).read_text(errors="replace")

    def wait(self, timeout=60):
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise AssertionError(f"launch did not end within {timeout} s:\n{self.output}")

    @property
    def run_dir(self):
        for line in reversed(self.output.splitlines()):
            if line.startswith("run directory: "):
                return self.cwd / line.split(": ", 1)[1]
        dirs = sorted(glob.glob(str(self.cwd / "runs" / "*")), key=os.path.getmtime)
        return Path(dirs[-1]) if dirs else None

    def metrics(self):
        path = self.run_dir / "metrics.jsonl"
        if not path.exists():
            return []
        out = []
        for line in path.read_text().splitlines():
            try:
                out.append(json.loads(line))
            except ValueError:
                pass
        return out

    def losses(self):
        return [r["loss"] for r in self.metrics() if "loss" in r]

    def pids(self):
        path = self.run_dir / "processes.json"
        return {int(k): v for k, v in json.loads(path.read_text())["children"].items()}

    def wait_for_steps(self, n, timeout=120):  # a bound on a hang: a loaded machine took >30 s
        """Block until the run has logged ``n`` steps (and the launcher still runs)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.run_dir is not None and len(self.losses()) >= n:
                return
            if self.proc.poll() is not None:
                raise AssertionError(f"launch ended early ({self.proc.returncode}):\n{self.output}")
            time.sleep(0.05)
        raise AssertionError(f"no {n} steps within {timeout} s:\n{self.output}")


def reference(config_path, overrides=(), steps=None):
    """The same training in this process, on the whole batch: what a pipeline reproduces
    bit for bit, and data-parallel replicas up to float rounding."""
    return train_in_one_process(load_config(config_path, list(overrides)), steps)


def kill_mid_run(launch, rank, after_steps):
    """SIGKILL process ``rank`` of a running launch once it has logged ``after_steps``
    steps; returns (its exit status, seconds it took to end, the pids of its processes)."""
    launch.wait_for_steps(after_steps)
    pids = launch.pids()
    os.kill(pids[rank], signal.SIGKILL)
    t0 = time.monotonic()
    code = launch.wait()
    return code, time.monotonic() - t0, pids


def kill_recorded(cwd):
    """Every process a launch under ``cwd`` recorded that still runs (a safety net)."""
    for path in glob.glob(os.path.join(cwd, "**", "processes*.json"), recursive=True):
        try:
            pids = json.loads(Path(path).read_text())["children"].values()
        except (OSError, ValueError, KeyError):
            continue
        for pid in pids:
            if pid_alive(pid) and _cwd(pid) == os.path.realpath(cwd):  # ours, not a reused pid
                os.kill(pid, signal.SIGKILL)


def _cwd(pid):
    try:
        return os.readlink(f"/proc/{pid}/cwd")
    except OSError:
        return None


def assert_all_gone(pids, timeout=5.0):
    deadline = time.monotonic() + timeout
    alive = [p for p in pids if pid_alive(p)]
    while alive and time.monotonic() < deadline:
        time.sleep(0.05)
        alive = [p for p in alive if pid_alive(p)]
    assert not alive, f"processes left behind: {alive}"

"""Launches across simulated hosts, as users run them on machines of their own.

Each host's launchers run in a directory of their own (``tmp/host0``, ``tmp/host1``):
what separate machines' disks are, so a test sees which files land on which host.
The engines' ports are fixed (29500...): every test has fresh hosts, each a network
namespace of its own, so nothing else can hold them.
"""
import os
import secrets
import subprocess
import sys
import time
from pathlib import Path

from launch_support import ROOT, TINY

PORT = 29500  # in the hosts' own namespaces: no other test can be there

#: variables of engines that must not leak into a test's launches from its own environment
_ENGINE_PREFIXES = ("SLURM_", "OMPI_", "PMI_", "PMIX_", "MV2_", "TORCHELASTIC_")
_ENGINE_NAMES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT",
                 "GROUP_RANK", "LOCAL_WORLD_SIZE", "DISTGRAD_WORLD_SECRET", "DISTGRAD_RESUME",
                 "DISTGRAD_RUN_DIR", "DISTGRAD_BIND_ADDR", "DISTGRAD_SOCKET_IFNAME")


def base_env(secret=None, **extra):
    """This process's environment without engine variables, with the checkout importable
    and one world secret (what every host of a launch must share)."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(_ENGINE_PREFIXES) and k not in _ENGINE_NAMES}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (ROOT, os.environ.get("PYTHONPATH")) if p)
    env["DISTGRAD_WORLD_SECRET"] = secret or secrets.token_hex(16)
    env.update({k: str(v) for k, v in extra.items()})
    return env


def tiny(tmp_path):
    path = Path(tmp_path) / "tiny.toml"
    path.write_text(TINY)
    return path


def host_dir(tmp_path, host):
    path = Path(tmp_path) / host.name
    path.mkdir(exist_ok=True)
    return path


class HostRun:
    """A command running on a simulated host, its output in ``output_path``."""

    def __init__(self, host, argv, env, cwd, output_path):
        self.host, self.cwd, self.output_path = host, Path(cwd), Path(output_path)
        with open(self.output_path, "wb") as out:
            self.proc = host.popen(argv, env=env, cwd=cwd, stdin=subprocess.DEVNULL,
                                   stdout=out, stderr=subprocess.STDOUT)

    @property
    def output(self):
        return self.output_path.read_text(errors="replace")

    def wait(self, timeout=180):
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise AssertionError(f"{self.output_path.name} did not end within {timeout} s:\n"
                                 f"{self.output}") from None


def launch_on(host, tmp_path, env, *args, label=None):
    """``python -m distgrad launch ARGS`` on ``host``, in that host's directory; its
    output in ``tmp_path/<label>.out``."""
    argv = [sys.executable, "-m", "distgrad", "launch", *map(str, args), "--no-progress",
            "--no-plot"]
    label = label or f"{host.name}-{len(os.listdir(tmp_path))}"
    return HostRun(host, argv, env, host_dir(tmp_path, host), Path(tmp_path) / f"{label}.out")


def run_dir(path):
    """The one run directory under ``path/runs``."""
    dirs = sorted((Path(path) / "runs").iterdir())
    assert len(dirs) == 1, dirs
    return dirs[0]


def read_losses(run):
    import json
    out = []
    for line in (Path(run) / "metrics.jsonl").read_text().splitlines():
        record = json.loads(line)
        if "loss" in record:
            out.append(record["loss"])
    return out


def wait_for_steps(run_parent, n, runs, timeout=60):
    """Block until the run under ``run_parent`` logged ``n`` steps (``runs`` still run)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = list((Path(run_parent) / "runs").glob("*/metrics.jsonl"))
        if found and len(read_losses(found[0].parent)) >= n:
            return found[0].parent
        ended = [r for r in runs if r.proc.poll() is not None]
        if ended:
            raise AssertionError(f"{ended[0].output_path.name} ended early:\n{ended[0].output}")
        time.sleep(0.05)
    raise AssertionError(f"no {n} steps within {timeout} s:\n{runs[0].output}")


def assert_nothing_left(hosts, timeout=10.0):
    """No process of a launch remains on any host (the hosts run nothing else)."""
    deadline = time.monotonic() + timeout
    while True:
        left = {h.name: h.pids() for h in hosts if h.pids()}
        if not left or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert not left, f"processes left behind: {left}"

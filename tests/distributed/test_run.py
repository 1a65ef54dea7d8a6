"""``distgrad.distributed.run`` (torchrun) on one node: ``python -m torch.distributed.run``
under as_torch, the workers' environment compared with real torchrun's, restarts and
failures, and distgrad workers under a real torchrun (its agent's store)."""
import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from distgrad.utils.ports import free_port
from distgrad.utils.tempdirs import pid_alive
from support.sessions import run_in_session

pytestmark = pytest.mark.timeout(240)

ROOT = Path(__file__).resolve().parents[2]
HAVE_TORCH = importlib.util.find_spec("torch") is not None

# What a worker reports: its torchrun environment (ports and ids vary per launch).
_ENV_PROBE = textwrap.dedent("""
    import json, os, sys
    names = ["RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK",
             "GROUP_WORLD_SIZE", "ROLE_RANK", "ROLE_NAME", "ROLE_WORLD_SIZE", "MASTER_ADDR",
             "TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_MAX_RESTARTS", "OMP_NUM_THREADS",
             "TORCH_NCCL_ASYNC_ERROR_HANDLING"]
    seen = {n: os.environ.get(n) for n in names}
    seen["has"] = sorted(n for n in ("MASTER_PORT", "TORCHELASTIC_RUN_ID",
                                     "TORCHELASTIC_ERROR_FILE",
                                     "TORCHELASTIC_USE_AGENT_STORE") if n in os.environ)
    seen["argv"] = sys.argv[1:]
    # one write per line: workers share the launcher's stdout (python -u: print would
    # write the newline separately, and two workers' lines could interleave)
    sys.stdout.write("ENV " + json.dumps(seen) + "\\n")
""")

# A worker of a process group: all_reduce of the ranks; fails once on request.
_PG_PROGRAM = textwrap.dedent("""
    import os, sys
    import {torch} as torch
    import {torch}.distributed as dist
    dist.init_process_group("gloo")
    t = torch.tensor([float(dist.get_rank() + 1)])
    dist.all_reduce(t)
    attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
    sys.stdout.write(f"RANK {{dist.get_rank()}} SUM {{t.item()}} ATTEMPT {{attempt}} "
                     f"AGENT_STORE {{os.environ['TORCHELASTIC_USE_AGENT_STORE']}}\\n")
    sys.stdout.flush()
    if "fail-first" in sys.argv and attempt == 0 and dist.get_rank() == 1:
        sys.exit(3)
    dist.destroy_process_group()
""")


def _env(tmp_path, as_torch):
    env = dict(os.environ)
    env.pop("DISTGRAD_AS_TORCH", None)
    env.pop("OMP_NUM_THREADS", None)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT)] + [p for p in env.get("PYTHONPATH", "")
                                                       .split(os.pathsep) if p])
    if as_torch:
        from distgrad.compat import as_torch as alias
        env = alias.child_environment(env)
    return env


def _launch(args, tmp_path, as_torch=True, timeout=150):
    """Run a launcher command in a session of its own; killed with whatever it started."""
    return run_in_session(args, _env(tmp_path, as_torch), tmp_path, timeout)


def _reports(out, tag):
    return [json.loads(line[len(tag) + 1:]) for line in out.splitlines()
            if line.startswith(tag + " ")]


def _probe_env(tmp_path, launcher):
    script = tmp_path / "probe.py"
    script.write_text(_ENV_PROBE)
    code, out, err = _launch(launcher + ["--nproc-per-node", "2", "--max-restarts", "2",
                                         "--master-port", str(free_port()), str(script),
                                         "--lr", "0.1"], tmp_path, as_torch=True)
    assert code == 0, err
    return sorted(_reports(out, "ENV"), key=lambda r: r["RANK"])


def test_python_dash_m_torch_distributed_run_gives_workers_torchruns_environment(tmp_path):
    ours = _probe_env(tmp_path, [sys.executable, "-m", "distgrad.compat.as_torch", "-m",
                                 "torch.distributed.run"])
    assert [r["RANK"] for r in ours] == ["0", "1"] and ours[1]["LOCAL_RANK"] == "1"
    assert ours[0]["argv"] == ["--lr", "0.1"] and ours[0]["OMP_NUM_THREADS"] == "1"
    assert ours[0]["has"] == ["MASTER_PORT", "TORCHELASTIC_ERROR_FILE",
                              "TORCHELASTIC_RUN_ID", "TORCHELASTIC_USE_AGENT_STORE"]
    if not HAVE_TORCH or shutil.which("torchrun") is None:
        return
    theirs = _probe_env(tmp_path, ["torchrun"])  # real torchrun; the probe imports nothing
    assert ours == theirs


@pytest.mark.parametrize("launcher", ["python -m distgrad.distributed.run",
                                      "as_torch torchrun script"])
def test_a_failed_worker_restarts_the_group_and_a_last_failure_is_reported(tmp_path, launcher):
    script = tmp_path / "pg.py"
    script.write_text(_PG_PROGRAM.format(torch="torch"))
    if launcher == "as_torch torchrun script":  # torchrun's own entry script, aliased
        entry = tmp_path / "torchrun"
        entry.write_text("import sys\nfrom torch.distributed.run import main\n"
                         "if __name__ == '__main__':\n    sys.exit(main())\n")
        base = [sys.executable, "-m", "distgrad.compat.as_torch", str(entry)]
    else:
        base = [sys.executable, "-m", "distgrad.distributed.run"]
    code, out, err = _launch(base + ["--standalone", "--nproc-per-node", "2",
                                     "--max-restarts", "1", str(script), "fail-first"],
                             tmp_path)
    assert code == 0, err
    lines = sorted(line for line in out.splitlines() if line.startswith("RANK"))
    assert lines == [f"RANK {r} SUM 3.0 ATTEMPT {a} AGENT_STORE False"
                     for r in (0, 1) for a in (0, 1)]
    assert "1/1 attempts left" in err
    code, out, err = _launch(base + ["--standalone", "--nproc-per-node", "2", str(script),
                                     "fail-first"], tmp_path)
    assert code == 1
    assert "ChildFailedError" in err and "pg.py FAILED" in err
    assert "rank      : 1 (local_rank: 1)" in err and "exitcode  : 3" in err


def test_what_the_launcher_cannot_do_is_refused_by_name(tmp_path):
    (tmp_path / "noop.py").write_text("")
    for extra, words in ((["--nnodes", "2", "--standalone"], "--standalone runs one node"),
                         (["--nnodes", "2", "--node-rank", "2"], "out of range"),
                         (["--rdzv-backend", "etcd"], "'static' or 'c10d'"),
                         (["--nnodes", "2:1"], "min_nodes must be > 0 and <= max_nodes"),
                         (["--run-path"], "--run-path"),
                         (["--redirects", "3"], "--redirects"),
                         (["--nproc-per-node", "gpu"], "Cuda is not available")):
        code, _, err = _launch([sys.executable, "-m", "distgrad.distributed.run"] + extra +
                               ["noop.py"], tmp_path, as_torch=False, timeout=60)
        assert code != 0 and words in err, (extra, err)


def test_workers_die_with_the_agent(tmp_path):
    script = tmp_path / "sleeper.py"
    script.write_text("import os, time\n"
                      "open(f'pid-{os.environ[\"RANK\"]}', 'w').write(str(os.getpid()))\n"
                      "time.sleep(120)\n")
    env = _env(tmp_path, as_torch=False)
    agent = subprocess.Popen([sys.executable, "-m", "distgrad.distributed.run", "--standalone",
                              "--nproc-per-node", "2", str(script)], cwd=tmp_path, env=env,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                             start_new_session=True)
    pids = []
    try:
        deadline = time.monotonic() + 60
        while len(pids) < 2 and time.monotonic() < deadline:
            pids = [int(p.read_text()) for p in tmp_path.glob("pid-*") if p.read_text()]
            time.sleep(0.05)
        assert len(pids) == 2
        agent.kill()  # no chance to clean up: the kernel must take the workers
        agent.wait(10)
        deadline = time.monotonic() + 10
        while any(pid_alive(p) and not _zombie(p) for p in pids) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not [p for p in pids if pid_alive(p) and not _zombie(p)]
    finally:
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        try:
            os.killpg(agent.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        agent.wait()


def _zombie(pid):
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rpartition(")")[2].split()[0] == "Z"
    except OSError:
        return False


@pytest.mark.skipif(not HAVE_TORCH or shutil.which("torchrun") is None,
                    reason="needs PyTorch's torchrun")
@pytest.mark.parametrize("how", ["import distgrad", "as_torch worker"])
def test_under_real_torchrun_workers_meet_in_the_agents_store(tmp_path, how):
    """Real torchrun serves a c10d store on MASTER_PORT (TORCHELASTIC_USE_AGENT_STORE=True):
    distgrad's init_process_group must use it, not listen there."""
    script = tmp_path / "pg.py"
    if how == "import distgrad":
        script.write_text(_PG_PROGRAM.format(torch="distgrad"))
        command = [str(script)]
    else:
        script.write_text(_PG_PROGRAM.format(torch="torch"))
        command = ["--no-python", sys.executable, "-m", "distgrad.compat.as_torch", str(script)]
    code, out, err = _launch(["torchrun", "--nproc-per-node", "2", "--master-port",
                              str(free_port())] + command, tmp_path, as_torch=False)
    assert code == 0, err
    lines = sorted(line for line in out.splitlines() if line.startswith("RANK"))
    assert lines == [f"RANK {r} SUM 3.0 ATTEMPT 0 AGENT_STORE True" for r in (0, 1)]


def test_workers_get_one_world_secret_from_the_agent(tmp_path):
    script = tmp_path / "secret.py"
    script.write_text("import os, sys\nsys.stdout.write('SECRET ' + os.environ.get("
                      "'DISTGRAD_WORLD_SECRET', '-') + '\\n')\n")
    env_args = [sys.executable, "-m", "distgrad.distributed.run", "--standalone",
                "--nproc-per-node", "2", str(script)]
    code, out, err = _launch(env_args, tmp_path, as_torch=False)
    assert code == 0, err
    secrets = [line.split()[1] for line in out.splitlines() if line.startswith("SECRET ")]
    assert len(secrets) == 2 and secrets[0] == secrets[1] and len(secrets[0]) == 64

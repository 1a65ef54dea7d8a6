"""``distgrad.distributed.run`` across simulated hosts: the static rendezvous (2 hosts x 2
workers: a process group with all_reduce and a DDP step, an RPC world), a worker failure
on one host restarting every node's workers, the elastic (c10d) rendezvous losing a host
or taking a newcomer, the world secret across hosts, bad input named, and PyTorch's
torchrun as the oracle of the workers' ranks."""
import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time

import pytest

pytestmark = pytest.mark.timeout(240)

HAVE_TORCH = importlib.util.find_spec("torch") is not None
RUN = [sys.executable, "-m", "distgrad.distributed.run"]
FAST = "keep_alive_interval=1,keep_alive_max_attempt=5"   # a lost host: 5 s
# An agent that must fail fast waits long for the store first: under load the agent that
# serves it may take seconds to start (its failure then is not "nothing answers").
PATIENT = ["--rdzv-conf", "timeout=60"]

_ENV_NAMES = ["RANK", "LOCAL_RANK", "GROUP_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE",
              "GROUP_WORLD_SIZE", "ROLE_RANK", "ROLE_WORLD_SIZE", "ROLE_NAME",
              "TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_MAX_RESTARTS", "TORCHELASTIC_RUN_ID",
              "MASTER_ADDR"]
_SECRET_PROBE = textwrap.dedent("""
    import os, sys
    sys.stdout.write("SECRET " + os.environ.get("DISTGRAD_WORLD_SECRET", "-") + "\\n")
""")

# what a worker reports of its environment (imports nothing: runs under any launcher)
ENV_PROBE = textwrap.dedent(f"""
    import json, os, sys
    seen = {{n: os.environ.get(n) for n in {_ENV_NAMES!r}}}
    sys.stdout.write("ENV " + json.dumps(seen) + "\\n")
""")

# a process group across the hosts: all_reduce and one DDP step; fails on request
PG_PROGRAM = textwrap.dedent("""
    import json, os, sys
    import distgrad as torch
    import distgrad.distributed as dist
    from distgrad.nn.parallel import DistributedDataParallel as DDP
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    t = torch.tensor([float(rank + 1)])
    dist.all_reduce(t)
    torch.manual_seed(0)
    model = DDP(torch.nn.Linear(3, 1))
    model(torch.full((2, 3), float(rank))).sum().backward()
    attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
    sys.stdout.write("OUT " + json.dumps({"rank": rank, "world": dist.get_world_size(),
                     "sum": t.item(), "grad": model.module.weight.grad.tolist(),
                     "attempt": attempt, "group_rank": int(os.environ["GROUP_RANK"])}) + "\\n")
    sys.stdout.flush()
    if ("fail-first" in sys.argv and attempt == 0 or "fail-always" in sys.argv) and rank == 3:
        sys.exit(3)
    dist.destroy_process_group()
""")

# an RPC world across the hosts: each rank calls the rank two ahead (on the other host)
RPC_PROGRAM = textwrap.dedent("""
    import os, sys
    import distgrad as torch
    import distgrad.distributed.rpc as rpc
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    rpc.init_rpc(f"w{rank}", rank=rank, world_size=world)
    peer = (rank + 2) % world
    got = rpc.rpc_sync(f"w{peer}", torch.add, args=(torch.ones(2), float(rank)))
    sys.stdout.write(f"RPC {rank} -> w{peer} {got.tolist()}\\n")
    sys.stdout.flush()
    rpc.shutdown()
""")

# an elastic worker: reports its world (in a file all hosts see: one line, one write),
# then waits to be stopped: in its first attempt ("first"), or while its world is smaller
# than 3 ("until-3")
ELASTIC_PROGRAM = textwrap.dedent("""
    import json, os, sys, time
    import distgrad as torch
    import distgrad.distributed as dist
    dist.init_process_group("gloo")
    t = torch.tensor([1.0])
    dist.all_reduce(t)
    line = json.dumps({"host": os.environ["TEST_HOST"], "rank": dist.get_rank(),
                       "world": dist.get_world_size(), "sum": t.item(),
                       "attempt": int(os.environ["TORCHELASTIC_RESTART_COUNT"])}) + "\\n"
    with open("reports.jsonl", "a") as fh:
        fh.write(line)
    if sys.argv[1] == "first" and os.environ["TORCHELASTIC_RESTART_COUNT"] == "0" \\
            or sys.argv[1] == "until-3" and dist.get_world_size() < 3:
        time.sleep(120)   # until the agent stops it
    dist.destroy_process_group()
""")


def _reports(out, tag):
    return [json.loads(line[len(tag) + 1:]) for line in out.splitlines()
            if line.startswith(tag + " ")]


def _program(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def _env(secret="test-secret-of-this-world", **extra):
    env = dict(os.environ)
    env.pop("DISTGRAD_WORLD_SECRET", None)
    env.pop("OMP_NUM_THREADS", None)
    if secret is not None:
        env["DISTGRAD_WORLD_SECRET"] = secret
    env.update(extra)
    return env


def _start(host, args, tmp_path, env=None):
    return host.popen(RUN + args, env=env or _env(), cwd=tmp_path, stdout=subprocess.PIPE,
                      stderr=subprocess.PIPE, text=True)


def _finish(procs, timeout=150):
    """[(exit status, stdout, stderr)] of agents started with :func:`_start`; one still
    running after ``timeout`` s is killed, its stderr saying what ran then."""
    results = []
    deadline = time.monotonic() + timeout
    for p in procs:
        try:
            out, err = p.communicate(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            running = _running()
            p.kill()
            out, err = p.communicate()
            err += f"\n[test: killed after the timeout; running then: {running}]"
        results.append((p.returncode, out, err))
    return results


def _running():
    """The distgrad agents and workers running on this machine (for a hung test's report)."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as fh:
                argv = fh.read().decode(errors="replace").split("\0")
        except OSError:
            continue
        if any("distgrad.distributed.run" in a or a.endswith(".py") and "pytest-of" in a
               for a in argv):
            found.append(f"{pid}: {' '.join(argv)[:160]}")
    return found


def _static(hosts, tmp_path, script, *script_args, nproc=(2, 2), extra=(), envs=None,
            port=29500):
    procs = [_start(h, ["--nnodes", str(len(hosts)), "--node-rank", str(i),
                        "--nproc-per-node", str(nproc[i]), "--master-addr", "host0",
                        "--master-port", str(port), *extra, script, *script_args],
                    tmp_path, envs[i] if envs else None)
             for i, h in enumerate(hosts)]
    return _finish(procs)


def _elastic(host, nnodes, tmp_path, script, *script_args, conf="", restarts=2):
    return _start(host, ["--nnodes", nnodes, "--nproc-per-node", "1", "--rdzv-backend", "c10d",
                         "--rdzv-endpoint", "host0:29400", "--rdzv-id", "job7",
                         "--max-restarts", str(restarts), "--monitor-interval", "0.1",
                         "--rdzv-conf", f"{FAST},last_call_timeout=1,{conf}".strip(","),
                         script, *script_args], tmp_path, _env(TEST_HOST=host.name))


def _worlds(tmp_path, host):
    """(world size, all_reduce sum, restart count) of each report of ``host``'s workers."""
    path = tmp_path / "reports.jsonl"
    lines = path.read_text().splitlines() if path.exists() else []
    return [(r["world"], r["sum"], r["attempt"]) for r in map(json.loads, lines)
            if r["host"] == host.name]


def _wait_until(condition, what, timeout=120):
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout} s: {what}")
        time.sleep(0.05)


# ---------------------------------------------------------------------- static
def test_two_hosts_of_two_workers_form_one_process_group_and_train_a_ddp_step(
        simulated_hosts, tmp_path):
    hosts = simulated_hosts(2)
    results = _static(hosts, tmp_path, _program(tmp_path, "pg.py", PG_PROGRAM))
    for code, out, err in results:
        assert code == 0, err
    by_host = [sorted(_reports(out, "OUT"), key=lambda r: r["rank"]) for _, out, _ in results]
    # RANK = node rank * nproc + local rank: ranks 0, 1 on host0, 2, 3 on host1
    assert [[r["rank"] for r in reps] for reps in by_host] == [[0, 1], [2, 3]]
    assert [[r["group_rank"] for r in reps] for reps in by_host] == [[0, 0], [1, 1]]
    for r in by_host[0] + by_host[1]:
        assert (r["world"], r["sum"], r["attempt"]) == (4, 10.0, 0)
        assert r["grad"] == [[3.0, 3.0, 3.0]]   # the mean of 2 * rank over ranks 0..3


def test_two_hosts_of_two_workers_form_one_rpc_world(simulated_hosts, tmp_path):
    hosts = simulated_hosts(2)
    results = _static(hosts, tmp_path, _program(tmp_path, "rpc.py", RPC_PROGRAM))
    for code, out, err in results:
        assert code == 0, err
    lines = sorted(line for _, out, _ in results for line in out.splitlines()
                   if line.startswith("RPC "))
    assert lines == [f"RPC {r} -> w{(r + 2) % 4} [{float(r + 1)}, {float(r + 1)}]"
                     for r in range(4)]


def test_a_worker_failure_on_one_host_restarts_every_nodes_workers(simulated_hosts, tmp_path):
    hosts = simulated_hosts(2)
    script = _program(tmp_path, "pg.py", PG_PROGRAM)
    results = _static(hosts, tmp_path, script, "fail-first", extra=["--max-restarts", "1"])
    for code, out, err in results:
        assert code == 0, err
        # every node's workers ran twice, and both agents counted the same attempts
        assert sorted(r["attempt"] for r in _reports(out, "OUT")) == [0, 0, 1, 1]
        assert "rank 3 (local rank 1) on host1" in err and "1/1 attempts left" in err
    # with no restart left, every agent fails and names the same root cause
    results = _static(hosts, tmp_path, script, "fail-always", port=29501)
    for code, out, err in results:
        assert code == 1
        assert "ChildFailedError" in err and "pg.py FAILED" in err
        root = err[err.index("Root Cause"):]
        assert "host      : host1" in root and "rank      : 3 (local_rank: 1)" in root
        assert "exitcode  : 3" in root


def test_nodes_may_run_different_numbers_of_workers(simulated_hosts, tmp_path):
    hosts = simulated_hosts(2)
    results = _static(hosts, tmp_path, _program(tmp_path, "probe.py", ENV_PROBE),
                      nproc=(1, 2))
    for code, _, err in results:
        assert code == 0, err
    seen = sorted((r for _, out, _ in results for r in _reports(out, "ENV")),
                  key=lambda r: int(r["RANK"]))
    assert [(r["RANK"], r["GROUP_RANK"], r["LOCAL_RANK"], r["LOCAL_WORLD_SIZE"])
            for r in seen] == [("0", "0", "0", "1"), ("1", "1", "0", "2"), ("2", "1", "1", "2")]
    assert {r["WORLD_SIZE"] for r in seen} == {"3"} and {r["MASTER_ADDR"] for r in seen} == \
        {"host0"}


@pytest.mark.skipif(not HAVE_TORCH or shutil.which("torchrun") is None,
                    reason="needs PyTorch's torchrun")
@pytest.mark.timeout(420)   # torchrun's agents import torch: seconds, a minute under load
def test_the_workers_ranks_are_those_of_pytorchs_torchrun(simulated_hosts, tmp_path):
    hosts = simulated_hosts(2)
    script = _program(tmp_path, "probe.py", ENV_PROBE)

    def ranks(launcher, port):
        procs = [h.popen(launcher + ["--nnodes", "2", "--node-rank", str(i), "--nproc-per-node",
                                     str(i + 1), "--master-addr", "host0", "--master-port",
                                     str(port), "--rdzv-id", "oracle", script],
                         env=_env(), cwd=tmp_path, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
                 for i, h in enumerate(hosts)]
        results = _finish(procs, timeout=200)
        for code, _, err in results:
            assert code == 0, err
        return sorted((r for _, out, _ in results for r in _reports(out, "ENV")),
                      key=lambda r: int(r["RANK"]))

    assert ranks(RUN, 29500) == ranks(["torchrun"], 29501)


def test_a_signal_to_one_agent_stops_every_nodes_workers_and_leaves_no_process(
        simulated_hosts, tmp_path):
    hosts = simulated_hosts(2)
    script = _program(tmp_path, "elastic.py", ELASTIC_PROGRAM)
    procs = [_start(h, ["--nnodes", "2", "--node-rank", str(i), "--master-addr", "host0",
                        "--master-port", "29500", script, "first"], tmp_path,
                    _env(TEST_HOST=h.name)) for i, h in enumerate(hosts)]
    _wait_until(lambda: all(_worlds(tmp_path, h) for h in hosts), "a world of 2 formed")
    procs[1].send_signal(signal.SIGTERM)
    (code0, _, err0), (code1, _, err1) = _finish(procs)
    assert code1 == 1 and "SignalException" in err1
    assert code0 == 1 and "ChildFailedError" in err0
    assert "the agent of node rank 1 (host1" in err0 and "got signal SIGTERM" in err0
    for h in hosts:
        _wait_until(lambda: not h.pids(), f"every process on {h.name} ended", timeout=30)


_TORCH_GLOO = textwrap.dedent("""
    import sys
    import torch
    import torch.distributed as dist
    dist.init_process_group("gloo")
    t = torch.tensor([float(dist.get_rank() + 1)])
    dist.all_reduce(t)
    sys.stdout.write(f"RANK {dist.get_rank()} OF {dist.get_world_size()} SUM {t.item()}\\n")
    dist.destroy_process_group()
""")


@pytest.mark.slow
@pytest.mark.skipif(not HAVE_TORCH or shutil.which("torchrun") is None,
                    reason="needs PyTorch's torchrun")
@pytest.mark.timeout(600)
def test_a_pytorch_gloo_program_runs_alike_under_both_launchers(simulated_hosts, tmp_path,
                                                                request):
    if "slow" not in (request.config.getoption("markexpr") or ""):
        pytest.skip("slow (a minute: torch's import in 12 processes): select with -m slow")
    hosts = simulated_hosts(2)
    script = _program(tmp_path, "gloo.py", _TORCH_GLOO)
    env = _env(GLOO_SOCKET_IFNAME="eth0")   # torch's gloo would trust the shared host name

    def lines(launcher, port):
        procs = [h.popen(launcher + ["--nnodes", "2", "--node-rank", str(i), "--nproc-per-node",
                                     "2", "--master-addr", "host0", "--master-port", str(port),
                                     script], env=env, cwd=tmp_path, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
                 for i, h in enumerate(hosts)]
        results = _finish(procs, timeout=400)
        for code, _, err in results:
            assert code == 0, err
        return sorted(line for _, out, _ in results for line in out.splitlines()
                      if line.startswith("RANK "))

    ours = lines(RUN, 29500)
    assert ours == [f"RANK {r} OF 4 SUM 10.0" for r in range(4)]
    assert ours == lines(["torchrun"], 29501)


# ---------------------------------------------------------------------- elastic
def test_an_elastic_world_goes_on_without_a_lost_host(simulated_hosts, tmp_path):
    hosts = simulated_hosts(3)
    script = _program(tmp_path, "elastic.py", ELASTIC_PROGRAM)
    procs = [_elastic(h, "2:3", tmp_path, script, "first") for h in hosts]
    _wait_until(lambda: all(_worlds(tmp_path, h) for h in hosts), "a world of 3 formed")
    hosts[1].kill_all()
    hosts[1].link_down()
    results = _finish([procs[0], procs[2]])
    for host, (code, out, err) in zip([hosts[0], hosts[2]], results):
        assert code == 0, err
        assert _worlds(tmp_path, host) == [(3, 3.0, 0), (2, 2.0, 1)]
        assert "the node on host1" in err and "was lost" in err and "2/2 attempts left" in err
    for h in hosts:   # nothing is left running anywhere
        _wait_until(lambda: not h.pids(), f"every process on {h.name} ended", timeout=30)


def test_an_elastic_world_below_its_minimum_fails_naming_the_lost_host(simulated_hosts,
                                                                        tmp_path):
    hosts = simulated_hosts(2)
    script = _program(tmp_path, "elastic.py", ELASTIC_PROGRAM)
    procs = [_elastic(h, "2:3", tmp_path, script, "first", conf="join_timeout=10")
             for h in hosts]
    _wait_until(lambda: all(_worlds(tmp_path, h) for h in hosts), "a world of 2 formed")
    hosts[1].kill_all()
    hosts[1].link_down()
    (code, out, err), = _finish([procs[0]])
    assert code == 1
    assert "RendezvousTimeoutError" in err and "did not reach --nnodes 2:3" in err
    assert "lost: the node on host1" in err


def test_a_node_that_comes_later_makes_the_elastic_world_start_again_with_it(simulated_hosts,
                                                                           tmp_path):
    hosts = simulated_hosts(3)
    script = _program(tmp_path, "elastic.py", ELASTIC_PROGRAM)
    first = [_elastic(h, "2:3", tmp_path, script, "until-3") for h in hosts[:2]]
    _wait_until(lambda: all(_worlds(tmp_path, h) for h in hosts[:2]), "a world of 2 formed")
    late = _elastic(hosts[2], "2:3", tmp_path, script, "until-3")
    for host, (code, out, err) in zip(hosts, _finish(first + [late])):
        assert code == 0, err
        # the world of 2 started again with the newcomer; a membership change is no
        # failure: the restart count stays 0
        assert _worlds(tmp_path, host)[-1] == (3, 3.0, 0)
        assert {a for _, _, a in _worlds(tmp_path, host)} == {0}


# ---------------------------------------------------------------------- the world secret
def test_a_secret_file_on_every_host_reaches_every_worker(simulated_hosts, tmp_path):
    hosts = simulated_hosts(2)
    path = tmp_path / "secret"
    path.write_text("the-secret-of-the-file\n")
    path.chmod(0o600)
    env = _env(secret=None, DISTGRAD_WORLD_SECRET_FILE=str(path))
    results = _static(hosts, tmp_path, _program(tmp_path, "secret.py", _SECRET_PROBE),
                      envs=[env, env])
    for code, out, err in results:
        assert code == 0, err
        assert "without a secret" not in err
        assert out.split() == ["SECRET", "the-secret-of-the-file"] * 2


def test_without_a_secret_the_launch_works_and_warns(simulated_hosts, tmp_path):
    hosts = simulated_hosts(2)
    env = _env(secret=None)
    results = _static(hosts, tmp_path, _program(tmp_path, "secret.py", _SECRET_PROBE),
                      nproc=(1, 1), envs=[env, env])
    for code, out, err in results:
        assert code == 0, err
        assert out.split() == ["SECRET", "-"]   # and no agent made one of its own
    # once for the job: by the agent that serves the store (node rank 0), not every node's
    (_, _, err0), (_, _, err1) = results
    assert err0.count("the torchrun agent of node rank 0 formed a world of 2 processes "
                      "without a secret") == 1, err0
    assert "DISTGRAD_WORLD_SECRET" in err0 and "without a secret" not in err1, err1


@pytest.mark.parametrize("host1_secret,words", [
    ("another-secret", "refused this agent's world secret"),
    (None, "refused this agent: this host has no world secret and the store's host a secret")])
def test_an_agent_without_the_worlds_secret_is_refused_naming_the_store(
        simulated_hosts, tmp_path, host1_secret, words):
    hosts = simulated_hosts(2)
    script = _program(tmp_path, "probe.py", ENV_PROBE)
    procs = [_start(h, ["--nnodes", "2", "--node-rank", str(i), "--master-addr", "host0",
                        "--master-port", "29500"]
                    + (PATIENT if i else ["--rdzv-conf", "timeout=15"])   # host1 must come
                    + [script], tmp_path, _env() if i == 0 else _env(secret=host1_secret))
             for i, h in enumerate(hosts)]
    (code0, _, err0), (code1, _, err1) = _finish(procs)
    assert code1 == 1 and "RendezvousConnectionError" in err1
    assert f"the rendezvous store at host0:29500 ({hosts[0].address}) {words}" in err1
    assert code0 == 1 and "missing: node ranks [1]" in err0


# ---------------------------------------------------------------------- bad input
_DISAGREE = ("node rank 1 (host1 ({addr1})) was started with --rdzv-backend static --nnodes 3 "
             "--max-restarts 0|node rank 0 (host0 ({addr0})) was started with --rdzv-backend "
             "static --nnodes 2 --max-restarts 0")


@pytest.mark.parametrize("host1_args,host0_timeout,words", [
    (["--nnodes", "3", *PATIENT], 15, _DISAGREE),   # host1 must come: both fail at once
    (["--master-addr", "nosuchhost", *PATIENT], 3,
     "cannot meet the other nodes' agents at nosuchhost:29500: the rendezvous host "
     "'nosuchhost' does not resolve"),
    (["--master-port", "29501", "--rdzv-conf", "timeout=3"], 3,
     "nothing answers at the rendezvous store host0:29501 ({addr0}) after 3 s (Connection "
     "refused)"),
])
def test_bad_input_on_one_host_fails_naming_the_host_and_the_address(
        simulated_hosts, tmp_path, host1_args, host0_timeout, words):
    hosts = simulated_hosts(2)
    script = _program(tmp_path, "probe.py", ENV_PROBE)
    procs = [_start(h, ["--nnodes", "2", "--node-rank", str(i), "--master-addr", "host0",
                        "--master-port", "29500"]
                    + (host1_args if i else ["--rdzv-conf", f"timeout={host0_timeout}"])
                    + [script], tmp_path)
             for i, h in enumerate(hosts)]
    started = time.monotonic()
    (code0, _, err0), (code1, _, err1) = _finish(procs)
    # (nodes that disagree: whichever agent read the state first set it, so either
    # agent may be the one found to differ; both fail naming both nodes)
    words = [w.format(addr0=hosts[0].address, addr1=hosts[1].address) for w in words.split("|")]
    assert code1 == 1 and any(w in err1 for w in words), err1
    assert code0 == 1 and ("missing: node ranks [1]" in err0 or "every node needs the same"
                           in err0)
    assert time.monotonic() - started < 60

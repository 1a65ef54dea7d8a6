"""``distgrad launch`` with its processes on two hosts, under the engines people run:
Kubernetes-style env, Slurm, torchrun and mpirun (simulated hosts: network namespaces).

Each run trains to its end with the losses of the same training in one process, bit
for bit; the metrics and the result are on rank 0's host only, each host has the
logs of its own processes, and nothing is left running on any host.
"""
import json
import random
import shutil
import subprocess
import sys

import pytest

pytest.importorskip("zmq")

from hosts_support import (PORT, HostRun, assert_nothing_left, base_env,  # noqa: E402
                           host_dir, launch_on, read_losses, run_dir, tiny)
from launch_support import reference  # noqa: E402

pytestmark = pytest.mark.timeout(300)

#: where the ranks of a 3-process world (coordinator and 2 stages) run
PLACES = {0: 0, 1: 0, 2: 1}


def _env_vars(rank, job):
    """Kubernetes' PyTorchJob (and anything else with torchrun's env contract)."""
    return {"RANK": rank, "WORLD_SIZE": 3, "MASTER_ADDR": "host0", "MASTER_PORT": PORT}


def _slurm_vars(rank, job):
    """What srun sets in each task of ``srun -N 2 -n 3`` (tasks 0 and 1 on host0)."""
    node = PLACES[rank]
    return {"SLURM_JOB_ID": job, "SLURM_JOBID": job, "SLURM_STEP_ID": 0, "SLURM_STEPID": 0,
            "SLURM_PROCID": rank, "SLURM_NTASKS": 3, "SLURM_NPROCS": 3,
            "SLURM_JOB_NODELIST": "host[0-1]", "SLURM_NODELIST": "host[0-1]",
            "SLURM_STEP_NODELIST": "host[0-1]", "SLURM_JOB_NUM_NODES": 2, "SLURM_NNODES": 2,
            "SLURM_STEP_NUM_NODES": 2, "SLURM_NODEID": node, "SLURM_LOCALID":
            [r for r in PLACES if PLACES[r] == node].index(rank),
            "SLURM_TASKS_PER_NODE": "2,1", "SLURM_STEP_TASKS_PER_NODE": "2,1",
            "SLURMD_NODENAME": f"host{node}"}


def _check_run(tmp_path, hosts, config, overrides=(), ranks_on=PLACES):
    """Rank 0's host has the run (metrics, result, every host named in hosts.json); each
    other host has the logs of its own ranks and no metrics; losses are the one-process
    run's, bit for bit."""
    home = run_dir(host_dir(tmp_path, hosts[0]))
    assert read_losses(home) == reference(config, list(overrides))
    assert json.loads((home / "result.json").read_text())["status"] == "finished"
    placed = json.loads((home / "hosts.json").read_text())
    for rank, node in ranks_on.items():
        host = hosts[node]
        assert placed[str(rank)]["host"] == f"{host.name} ({host.address})"
        logs = {p.name.split("-")[0] for p in (run_dir(host_dir(tmp_path, host)) / "logs").iterdir()}
        assert str(rank) in logs
    for host in hosts[1:]:
        assert not (run_dir(host_dir(tmp_path, host)) / "metrics.jsonl").exists()
    return home


@pytest.mark.parametrize("engine", [_env_vars, _slurm_vars], ids=["env", "slurm"])
def test_a_launch_spans_two_hosts(simulated_hosts, tmp_path, engine):
    hosts = simulated_hosts(2, private_shm=True)
    config, env, job = tiny(tmp_path), base_env(), random.randrange(1000, 99999)
    runs = [launch_on(hosts[node], tmp_path, dict(env, **{k: str(v) for k, v in
                                                          engine(rank, job).items()}),
                      config, "checkpoint.every=3", label=f"rank{rank}")
            for rank, node in PLACES.items()]
    for run in runs:
        assert run.wait() == 0, run.output
    home = _check_run(tmp_path, hosts, config)
    # each stage's checkpoint on its own host, the manifest on the coordinator's
    for step in ("step-00000003", "step-00000006"):
        assert (home / "checkpoints" / step / "manifest.ckpt").exists()
        assert (home / "checkpoints" / step / "stage0.ckpt").exists()
        other = run_dir(host_dir(tmp_path, hosts[1])) / "checkpoints" / step
        assert sorted(p.name for p in other.iterdir()) == ["stage1.ckpt"]
    if engine is _slurm_vars:
        assert home.name == f"tiny-slurm{job}"
    assert f"rank 2 on " in runs[2].output and f"at {hosts[1].address}" in runs[2].output
    assert_nothing_left(hosts)


# PyTorch's costs ~20 s of CPU (the agents and every rank import torch): -m slow only
ENGINES = [pytest.param("torch.distributed.run", marks=pytest.mark.slow),
           "distgrad.distributed.run"]


@pytest.mark.parametrize("engine", ENGINES)
def test_a_launch_runs_as_the_tasks_of_a_two_node_torchrun(simulated_hosts, tmp_path, engine):
    if engine.startswith("torch."):
        pytest.importorskip("torch")
    hosts = simulated_hosts(2, private_shm=True)
    config, env = tiny(tmp_path), base_env()
    runs = [HostRun(host, [sys.executable, "-m", engine, "--nnodes", "2", "--node-rank",
                           str(node), "--nproc-per-node", "2", "--master-addr", "host0",
                           "--master-port", str(PORT), "--local-addr", host.name,
                           "-m", "distgrad", "launch", config, "world.workers=3",
                           f"world.rendezvous_port={PORT + 1}", "--no-progress",
                           "--no-plot"], env, host_dir(tmp_path, host),
                    tmp_path / f"node{node}.out")
            for node, host in enumerate(hosts)]
    codes = [run.wait() for run in runs]
    refusal = "starts the workers of one node"
    if refusal in runs[0].output:  # our own torchrun, before it spans nodes
        pytest.skip(f"{engine}: {refusal}")
    assert codes == [0, 0], runs[0].output + runs[1].output
    # torchrun's default run id ("none") is every job's: the run's name comes from rank 0
    home = _check_run(tmp_path, hosts, config, ["world.workers=3"],
                      {0: 0, 1: 0, 2: 1, 3: 1})
    assert home.name != "tiny-none"
    world = json.loads((home / "launch.json").read_text())["world"]
    host, port = world["init_method"].removeprefix("tcp://").rsplit(":", 1)
    assert host in (hosts[0].name, hosts[0].address)
    if engine.startswith("torch."):
        # under torch's agent store, rank 0 serves the rendezvous at the port given (one to
        # open in a firewall); our agents hand the workers a MASTER_PORT, which wins
        assert int(port) == PORT + 1
    assert run_dir(host_dir(tmp_path, hosts[1])).name == home.name
    assert_nothing_left(hosts)


def _openmpi():
    mpirun = shutil.which("mpirun")
    if mpirun is None:
        return None, "mpirun is not installed (apt-get install openmpi-bin)"
    version = subprocess.run([mpirun, "--version"], capture_output=True, text=True).stdout
    if "Open MPI" not in version:
        return None, f"mpirun is not OpenMPI's ({version.splitlines()[:1]})"
    return mpirun, None


def test_a_launch_runs_as_the_ranks_of_mpirun_across_two_hosts(simulated_hosts, tmp_path):
    mpirun, why = _openmpi()
    if mpirun is None:
        pytest.skip(why)
    hosts = simulated_hosts(2, private_shm=True)
    config, env = tiny(tmp_path), base_env(MASTER_ADDR="host0")
    # OpenMPI reaches the other hosts through an rsh agent: this one enters the host's
    # namespace instead of ssh-ing to it; each host's ranks run in that host's directory
    agent = tmp_path / "rsh-agent"
    agent.write_text(f'#!/bin/sh\nhost="$1"; shift\nexec ip netns exec "{hosts.prefix}-$host" '
                     f'env SIMULATED_HOST="$host" sh -c "$*"\n')
    agent.chmod(0o755)
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("host0 slots=2\nhost1 slots=2\n")
    for host in hosts:
        host_dir(tmp_path, host)
    script = (f'cd "{tmp_path}/${{SIMULATED_HOST:-host0}}" && exec "{sys.executable}" -m '
              f'distgrad launch "{config}" --no-progress --no-plot')
    run = HostRun(hosts[0], [mpirun, "--allow-run-as-root", "-np", "3", "--hostfile", hostfile,
                             "--map-by", "node", "--mca", "plm_rsh_agent", agent,
                             "--mca", "oob_tcp_if_include", "eth0",
                             "-x", "PYTHONPATH", "-x", "DISTGRAD_WORLD_SECRET",
                             "-x", "MASTER_ADDR", "sh", "-c", script],
                  env, tmp_path, tmp_path / "mpirun.out")
    assert run.wait() == 0, run.output
    # --map-by node: ranks 0 and 2 on host0, rank 1 on host1
    _check_run(tmp_path, hosts, config, ranks_on={0: 0, 1: 1, 2: 0})
    assert "mpi launch, rank 1 of 3" in run.output
    assert_nothing_left(hosts)


@pytest.mark.slow
def test_each_host_keeps_its_stages_checkpoints_and_a_resume_finds_them(simulated_hosts,
                                                                          tmp_path):
    """On disks of their own, the coordinator's host has each checkpoint's manifest and
    every other host its own stages' files; the same ranks on the same hosts resume the
    run, bit for bit."""
    hosts = simulated_hosts(2)
    config, env = tiny(tmp_path), base_env()
    for overrides in (["run.steps=4"], ["run.steps=8", "--resume"]):
        runs = [launch_on(hosts[node], tmp_path, dict(env, **{k: str(v) for k, v in
                                                              _env_vars(rank, 0).items()}),
                          config, "checkpoint.every=2", *overrides)
                for rank, node in PLACES.items()]
        for run in runs:
            assert run.wait() == 0, run.output
    assert "steps 5..8, resumed from" in runs[0].output
    home, other = (run_dir(host_dir(tmp_path, h)) for h in hosts)
    assert read_losses(home) == reference(config, ["run.steps=8"])
    assert (other / "checkpoints" / "step-00000004" / "stage1.ckpt").exists()
    assert not (other / "checkpoints" / "step-00000004" / "manifest.ckpt").exists()
    assert_nothing_left(hosts)


def test_mpirun_on_one_host_meets_on_loopback_without_master_addr(simulated_hosts, tmp_path):
    """All ranks on one host: no MASTER_ADDR needed; the port comes from the MPI job's id
    (a host of its own: that port cannot collide with another test's)."""
    mpirun, why = _openmpi()
    if mpirun is None:
        pytest.skip(why)
    (host,) = simulated_hosts(1)
    config = tiny(tmp_path)
    run = HostRun(host, [mpirun, "--allow-run-as-root", "--oversubscribe", "-np", "3",
                         "-x", "PYTHONPATH", "-x", "DISTGRAD_WORLD_SECRET", sys.executable, "-m",
                         "distgrad", "launch", config, "--no-progress", "--no-plot"],
                  base_env(), host_dir(tmp_path, host), tmp_path / "mpirun.out")
    assert run.wait() == 0, run.output
    assert "rendezvous via 127.0.0.1:" in run.output
    assert "(OMPI_COMM_WORLD_LOCAL_SIZE=3: one host)" in run.output
    assert read_losses(run_dir(host_dir(tmp_path, host))) == reference(config)
    assert_nothing_left([host])

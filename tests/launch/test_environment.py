"""Which engine started a launcher, which ranks it starts and where the world meets:
torchrun, mpirun (OpenMPI, MVAPICH2, MPICH), Slurm and plain env, from their variables."""
import os
import subprocess
import sys

import pytest

from distgrad.launch.environment import check_addresses, detect, job_port

from launch_support import ROOT, TINY

pytestmark = pytest.mark.timeout(60)


def _openmpi(rank, size=3, local=3, **extra):
    env = {"OMPI_COMM_WORLD_RANK": str(rank), "OMPI_COMM_WORLD_SIZE": str(size),
           "OMPI_COMM_WORLD_LOCAL_SIZE": str(local), "OMPI_MCA_ess_base_jobid": "2119172097"}
    return dict(env, **extra)


def test_mpirun_on_one_host_meets_on_loopback_at_a_port_of_its_job():
    layout = detect(2, _openmpi(1))
    assert (layout.kind, layout.world_size, layout.ranks) == ("mpi", 3, [1])
    assert layout.rendezvous == f"tcp://127.0.0.1:{job_port('2119172097')}"
    assert layout.run_id == "mpi2119172097" and layout.transport == "tcp"
    # OpenMPI 5 (and any PMIx launcher) names its job by a namespace
    five = detect(2, dict(_openmpi(0), OMPI_MCA_ess_base_jobid="",
                          PMIX_NAMESPACE="prterun-node1-4782@1"))
    assert five.rendezvous.endswith(f":{job_port('prterun-node1-4782@1')}")
    assert five.run_id == "mpiprterun-node1-4782-1"
    assert 15000 <= job_port("prterun-node1-4782@1") < 30000


def test_mpirun_across_hosts_needs_master_addr_and_says_how_to_give_it():
    with pytest.raises(ValueError, match=r"OMPI_COMM_WORLD_LOCAL_SIZE=2 of "
                                         r"OMPI_COMM_WORLD_SIZE=3\) .*set MASTER_ADDR to rank "
                                         r"0's host .*mpirun -x MASTER_ADDR="):
        detect(2, _openmpi(2, local=2))
    layout = detect(2, _openmpi(2, local=2, MASTER_ADDR="node1", MASTER_PORT="29400"))
    assert layout.rendezvous == "tcp://node1:29400" and layout.host == "node1"
    with pytest.raises(ValueError, match="OMPI_COMM_WORLD_SIZE=4 but the config's "
                                         "world.workers needs 3 processes"):
        detect(2, _openmpi(0, size=4, local=4))


def test_mpich_names_no_job_so_its_port_is_master_port():
    hydra = {"PMI_RANK": "1", "PMI_SIZE": "3", "MPI_LOCALNRANKS": "3"}
    with pytest.raises(ValueError, match=r"MPICH/Intel MPI names no job id .*set MASTER_PORT"):
        detect(2, hydra)
    layout = detect(2, dict(hydra, MASTER_PORT="29400"))
    assert (layout.kind, layout.ranks, layout.rendezvous) == ("mpi", [1],
                                                              "tcp://127.0.0.1:29400")
    mvapich = detect(2, {"MV2_COMM_WORLD_RANK": "2", "MV2_COMM_WORLD_SIZE": "3",
                         "MV2_COMM_WORLD_LOCAL_SIZE": "1", "MASTER_ADDR": "10.0.0.1",
                         "MASTER_PORT": "29400"})
    assert (mvapich.kind, mvapich.ranks) == ("mpi", [2])


def _slurm(rank, **extra):
    env = {"SLURM_PROCID": str(rank), "SLURM_NTASKS": "3", "SLURM_JOB_ID": "4242",
           "SLURM_STEP_ID": "0", "SLURM_JOB_NODELIST": "gpu[01-04]",
           "SLURM_STEP_NODELIST": "gpu[03-04]", "SLURM_JOB_NUM_NODES": "4",
           "SLURM_NODEID": "1", "SLURM_LOCALID": "0"}
    return dict(env, **extra)


def test_slurm_meets_on_the_first_host_of_the_step_or_where_master_addr_says():
    layout = detect(2, _slurm(2))
    assert layout.rendezvous == "tcp://gpu03:19242" and layout.named_by == "SLURM_STEP_NODELIST"
    given = detect(2, _slurm(2, MASTER_ADDR="gpu04", MASTER_PORT="29400"))
    assert given.rendezvous == "tcp://gpu04:29400"
    with pytest.raises(ValueError, match="SLURM_NTASKS or SLURM_JOB_ID is not"):
        detect(2, {"SLURM_PROCID": "0"})


def test_the_rendezvous_port_can_be_pinned_where_the_engine_names_none():
    """``world.rendezvous_port``: one port to open in a firewall instead of a derived one
    (Slurm, mpirun) or a free one (next to torchrun's store); MASTER_PORT still wins."""
    assert detect(2, _slurm(1), port=17000).rendezvous == "tcp://gpu03:17000"
    assert detect(2, _slurm(1, MASTER_PORT="29400"), port=17000).rendezvous.endswith(":29400")
    hydra = {"PMI_RANK": "1", "PMI_SIZE": "3", "MPI_LOCALNRANKS": "3"}
    assert detect(2, hydra, port=17000).rendezvous == "tcp://127.0.0.1:17000"
    agent = {"RANK": "0", "WORLD_SIZE": "3", "MASTER_ADDR": "host0", "MASTER_PORT": "29400",
             "TORCHELASTIC_RUN_ID": "j", "TORCHELASTIC_USE_AGENT_STORE": "True"}
    assert detect(2, agent, port=17000).port == 17000


def test_the_engine_that_started_the_process_wins_over_srun_variables_it_inherited():
    # mpirun inside an allocation starts its daemons with srun: the ranks inherit the
    # daemon's SLURM_PROCID (its node), not their own
    assert detect(2, dict(_slurm(1), **_openmpi(2, local=1, MASTER_ADDR="gpu03"))).kind == "mpi"
    # srun --mpi=pmix started the ranks itself: both say the same, Slurm's way finds rank 0
    same = dict(_slurm(2), PMI_RANK="2", PMI_SIZE="3")
    assert detect(2, same).kind == "slurm"
    # `srun --ntasks-per-node=1 torchrun ...`: the workers are torchrun's
    torchrun = dict(_slurm(2), RANK="1", WORLD_SIZE="3", MASTER_ADDR="gpu03",
                    MASTER_PORT="29500", TORCHELASTIC_RUN_ID="7")
    layout = detect(2, torchrun)
    assert (layout.kind, layout.ranks, layout.run_id) == ("torchrun", [1], "7")


def test_a_torchrun_group_smaller_than_the_world_starts_every_nth_rank():
    env = {"RANK": "1", "WORLD_SIZE": "2", "MASTER_ADDR": "host0", "MASTER_PORT": "29400",
           "TORCHELASTIC_RUN_ID": "none", "TORCHELASTIC_USE_AGENT_STORE": "True",
           "TORCHELASTIC_RESTART_COUNT": "1", "TORCHELASTIC_MAX_RESTARTS": "3"}
    layout = detect(4, env)
    assert (layout.kind, layout.world_size, layout.ranks) == ("torchrun", 5, [1, 3])
    assert layout.group_size == 2 and layout.restart == 1 and layout.engine_restarts == 3
    # torchrun's default id is every job's: agreed in the agent's store instead
    assert layout.run_id is None and layout.agent_store and layout.rendezvous is None
    # our own torchrun keeps no store: rank 0 serves MASTER_PORT itself
    own = detect(4, dict(env, TORCHELASTIC_USE_AGENT_STORE="False"))
    assert own.rendezvous == "tcp://host0:29400" and own.run_id == "host0-29400"
    with pytest.raises(ValueError, match="WORLD_SIZE=6 but the config's world.workers needs 5"):
        detect(4, dict(env, WORLD_SIZE="6"))


def test_addresses_are_checked_before_anything_starts(monkeypatch):
    env = {"RANK": "1", "WORLD_SIZE": "3", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29400"}
    line = check_addresses(detect(2, env))
    assert "rank 1 on " in line and "at 127.0.0.1" in line
    assert "rendezvous via 127.0.0.1:29400 (MASTER_ADDR)" in line
    monkeypatch.setenv("DISTGRAD_SOCKET_IFNAME", "nosuch9")
    with pytest.raises(ValueError, match=r"\(rank 1\): DISTGRAD_SOCKET_IFNAME='nosuch9': this "
                                         r"host has no interface 'nosuch9'"):
        check_addresses(detect(2, env))


def test_run_max_restarts_under_torchrun_is_the_agents_to_keep(tmp_path):
    config = tmp_path / "tiny.toml"
    config.write_text(TINY)
    env = dict(os.environ, PYTHONPATH=ROOT, RANK="1", WORLD_SIZE="3", MASTER_ADDR="127.0.0.1",
               MASTER_PORT="29400", TORCHELASTIC_RUN_ID="x", TORCHELASTIC_MAX_RESTARTS="1")
    done = subprocess.run([sys.executable, "-m", "distgrad", "launch", str(config),
                           "run.max_restarts=2", "--check"], capture_output=True, text=True,
                          env=env, cwd=tmp_path, timeout=60)
    assert done.returncode == 2
    assert "run.max_restarts=2, but torchrun restarts this launch at most 1 times " \
           "(TORCHELASTIC_MAX_RESTARTS)" in done.stderr and "--max-restarts 2" in done.stderr

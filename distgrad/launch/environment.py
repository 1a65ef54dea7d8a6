"""Where a launch's processes come from: this machine, Slurm, or a torchrun-style job.

- **local** (the default): this launcher starts the coordinator and every worker;
  the rendezvous is a unix socket in a private temp directory, so launches side by
  side never share a port.
- **Slurm** (``srun -n 3 --overcommit distgrad launch cfg.toml``): every task runs a
  launcher that starts one process, rank ``SLURM_PROCID`` of ``SLURM_NTASKS`` (srun
  starts no task at all until the job has a CPU per task, unless ``--overcommit``); the
  coordinator runs on the first host of ``SLURM_JOB_NODELIST`` and the rendezvous
  port is derived from ``SLURM_JOB_ID`` (15000 + id mod 15000: below Linux's
  ephemeral range, different for concurrent jobs).
- **torchrun / Kubernetes PyTorchJob** (``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``,
  ``MASTER_PORT``): one process per launcher as well. Under torchrun its agent
  already listens on ``MASTER_PORT`` with a key-value store; rank 0 then binds a
  free port and publishes it in that store. Without an agent, ``MASTER_PORT``
  itself is the rendezvous.

>>> first_host("node[07-09,12],gpu01")
'node07'
>>> slurm_port("123456")
18456
"""
import datetime
import os
import re
import socket

from distgrad.utils import addresses
from distgrad.utils.cpus import allocate_cpus, allowed_cpus
from distgrad.utils.ports import free_port

__all__ = ["Layout", "detect", "first_host", "slurm_port", "cpu_count", "worker_cores",
           "torchrun_rendezvous", "own_address"]


class Layout:
    """The world of one launch and which of its ranks this launcher starts."""

    def __init__(self, kind, world_size, ranks, rendezvous=None, run_id=None,
                 bind_addr=None):
        self.kind, self.world_size, self.ranks = kind, world_size, list(ranks)
        self.rendezvous = rendezvous   # None: local, made by the supervisor
        self.run_id = run_id           # names the run directory all launchers share
        self.bind_addr = bind_addr     # None: the config's world.bind_addr
        # processes started by different launchers may be on different hosts: unix
        # sockets would not reach them
        self.transport = None if kind == "local" else "tcp"

    @property
    def local(self):
        return self.kind == "local"

    def __repr__(self):
        return (f"Layout({self.kind}, world_size={self.world_size}, ranks={self.ranks}, "
                f"rendezvous={self.rendezvous!r})")


def cpu_count():
    return len(allowed_cpus())


def worker_cores(layout, threads):
    """``{rank: cores}`` for the workers this launcher starts (``world.pin_workers``):
    ``threads`` cores each, in turn over the cores it may use. Only a local launch pins:
    elsewhere each launcher starts one process and cannot know what its neighbours on
    the same host took (Slurm gives each task a cpuset of its own anyway)."""
    if not layout.local:
        return {}
    ranks = [r for r in layout.ranks if r != 0]
    return dict(zip(ranks, allocate_cpus(len(ranks), threads, allowed_cpus())))


def first_host(nodelist):
    """The first host name of a Slurm node list (``a[01-03,7],b`` -> ``a01``)."""
    m = re.match(r"([^,\[]+)(?:\[([^\]]+)\])?", nodelist.strip())
    if not m:
        raise ValueError(f"cannot read SLURM_JOB_NODELIST {nodelist!r}")
    prefix, ranges = m.group(1), m.group(2)
    if not ranges:
        return prefix
    first = ranges.split(",")[0].split("-")[0]
    return prefix + first


def slurm_port(job_id):
    return 15000 + int(job_id) % 15000


def _int_env(env, name):
    value = env.get(name)
    try:
        return int(value)
    except (TypeError, ValueError):
        raise ValueError(f"environment variable {name}={value!r} is not an integer") from None


def detect(workers, env=None, force_local=False):
    """The :class:`Layout` for this process's environment and ``workers`` stages."""
    env = os.environ if env is None else env
    world = workers + 1
    if force_local or not (env.get("SLURM_PROCID") or env.get("RANK")):
        return Layout("local", world, range(world))
    if env.get("SLURM_PROCID") and env.get("SLURM_NTASKS") and env.get("SLURM_JOB_ID"):
        if not (env.get("SLURM_STEP_ID") or env.get("SLURM_STEPID")):
            # a job's batch script has SLURM_PROCID=0 too, but no other task will ever come
            raise ValueError(
                f"this is the batch script of Slurm job {env['SLURM_JOB_ID']}, not a task of "
                f"an srun step: start one launcher per process with `srun --overcommit "
                f"distgrad launch ...` (--overcommit: also where the job has fewer CPUs than "
                f"tasks), or every process here with --local")
        size = _int_env(env, "SLURM_NTASKS")
        _check_size(size, world, "SLURM_NTASKS")
        rank = _int_env(env, "SLURM_PROCID")
        host = first_host(env.get("SLURM_JOB_NODELIST") or socket.gethostname())
        # the rendezvous runs on the first host; each process binds its address toward
        # it (utils/addresses.py), whatever this host's name resolves to
        rendezvous = addresses.endpoint(host, slurm_port(env["SLURM_JOB_ID"]))
        return Layout("slurm", size, [rank], rendezvous,
                      run_id=f"slurm{env['SLURM_JOB_ID']}")
    size, rank = _int_env(env, "WORLD_SIZE"), _int_env(env, "RANK")
    _check_size(size, world, "WORLD_SIZE")
    addr, port = env.get("MASTER_ADDR"), env.get("MASTER_PORT")
    if not addr or not port:
        raise ValueError("RANK is set but MASTER_ADDR/MASTER_PORT are not: a torchrun-style "
                         "launch needs all four (or pass --local)")
    run_id = env.get("TORCHELASTIC_RUN_ID") or f"{addr}-{port}"
    if env.get("TORCHELASTIC_USE_AGENT_STORE", "").lower() == "true":
        return Layout("torchrun", size, [rank], None, run_id=run_id)
    return Layout("env", size, [rank], addresses.endpoint(addr, int(port)), run_id=run_id)


def _check_size(size, world, name):
    if size != world:
        raise ValueError(f"{name}={size} but the config's world.workers needs {world} "
                         f"processes (the coordinator and {world - 1} workers); run with "
                         f"world.workers={size - 1} or {world} tasks")


def own_address(rendezvous, bind_addr="auto"):
    """The address this process advertises in a world that meets at ``rendezvous``
    (``world.bind_addr``: "auto" chooses it toward the rendezvous host)."""
    if bind_addr and bind_addr != "auto" and not addresses.is_wildcard(bind_addr):
        return bind_addr
    toward = addresses.host_port(rendezvous)[0] if rendezvous.startswith("tcp://") else None
    env = {"DISTGRAD_BIND_ADDR": bind_addr} if bind_addr and bind_addr != "auto" else None
    return addresses.choose(toward, "rpc", env=env).advertise


def torchrun_rendezvous(rank, env=None, timeout=60.0):
    """Under torchrun: rank 0 picks a free port and publishes ``tcp://host:port`` in the
    agent's store; the other ranks read it from there."""
    import torch.distributed as dist  # present wherever torchrun is
    env = os.environ if env is None else env
    store = dist.TCPStore(env["MASTER_ADDR"], int(env["MASTER_PORT"]), is_master=False,
                          timeout=datetime.timedelta(seconds=timeout))
    key = f"distgrad/launch/{env.get('TORCHELASTIC_RESTART_COUNT', '0')}/rendezvous"
    if rank == 0:
        # rank 0 need not run on MASTER_ADDR's host (the agents' store may be elsewhere)
        host = own_address(addresses.endpoint(env["MASTER_ADDR"], env["MASTER_PORT"]))
        address = addresses.endpoint(host, free_port(host))  # closed just before rank 0 binds it
        store.set(key, address)
        return address
    return store.get(key).decode()  # waits (up to the store's timeout) for rank 0

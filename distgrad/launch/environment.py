"""Where a launch's processes come from: this machine, torchrun, mpirun, Slurm or plain env.

- **local** (the default): this launcher starts the coordinator and every worker;
  the rendezvous is a unix socket in a private temp directory, so launches side by
  side never share a port.
- **torchrun** (``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT`` and
  ``TORCHELASTIC_RUN_ID``): one launcher per process of torchrun's group. Under
  PyTorch's torchrun its agent already listens on ``MASTER_PORT`` with a key-value
  store (``TORCHELASTIC_USE_AGENT_STORE``); rank 0 then binds a free port and
  publishes it there, with the run's name. Otherwise ``MASTER_PORT`` itself is the
  rendezvous. A group smaller than the world (an elastic group that lost a node) runs
  the whole world anyway: process r of N starts ranks r, r + N, ...; after a restart
  by the agent (``TORCHELASTIC_RESTART_COUNT``) the run continues from its last
  checkpoint.
- **mpi** (``mpirun``/``mpiexec``: OpenMPI's ``OMPI_COMM_WORLD_*``, MVAPICH2's
  ``MV2_COMM_WORLD_*``, MPICH's and Intel MPI's ``PMI_RANK``/``PMI_SIZE``): one
  launcher per MPI rank. Rank 0's address is ``MASTER_ADDR`` (``mpirun -x
  MASTER_ADDR=...``), 127.0.0.1 when every rank is on one host; the port is
  ``MASTER_PORT``, else derived from the MPI job's id as Slurm's is.
- **Slurm** (``srun -n 3 --overcommit distgrad launch cfg.toml``): one launcher per
  task, rank ``SLURM_PROCID`` of ``SLURM_NTASKS`` (srun starts no task at all until the
  job has a CPU per task, unless ``--overcommit``); the coordinator runs on the first
  host of the step's node list (or ``MASTER_ADDR``) and the rendezvous port is derived
  from ``SLURM_JOB_ID`` (15000 + id mod 15000: below Linux's ephemeral range,
  different for concurrent jobs), unless ``MASTER_PORT`` is set.
- **env** (Kubernetes' PyTorchJob and the like: ``RANK``, ``WORLD_SIZE``,
  ``MASTER_ADDR``, ``MASTER_PORT``): one launcher per process; ``MASTER_PORT`` is the
  rendezvous, served by rank 0.

When several are present, the first in this list wins: torchrun, mpi, Slurm, env (a
torchrun or mpirun started by srun inherits srun's variables, which describe srun's
tasks, not the processes of the launch).

>>> first_host("node[07-09,12],gpu01")
'node07'
>>> slurm_port("123456")
18456
"""
import datetime
import os
import re
import socket
import time
import uuid
import zlib

from distgrad.utils import addresses
from distgrad.utils.cpus import allocate_cpus, allowed_cpus
from distgrad.utils.ports import free_port

__all__ = ["Layout", "detect", "first_host", "slurm_port", "job_port", "cpu_count",
           "worker_cores", "torchrun_rendezvous", "own_address", "check_addresses"]

#: MPI implementations: (name, rank, size, ranks on this host) variables
_MPI = (
    ("OpenMPI", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", ("OMPI_COMM_WORLD_LOCAL_SIZE",)),
    ("MVAPICH2", "MV2_COMM_WORLD_RANK", "MV2_COMM_WORLD_SIZE", ("MV2_COMM_WORLD_LOCAL_SIZE",)),
    ("MPICH/Intel MPI", "PMI_RANK", "PMI_SIZE", ("MPI_LOCALNRANKS", "PMI_LOCAL_SIZE")),
)
#: variables naming an MPI job (OpenMPI 4, any PMIx launcher such as OpenMPI 5's)
_MPI_JOB = ("OMPI_MCA_ess_base_jobid", "PMIX_NAMESPACE")


class Layout:
    """The world of one launch and which of its ranks this launcher starts.

    ``host``/``named_by``: the rendezvous host as the environment names it (a name or an
    address) and the variable that named it; ``restart``: how many times the engine
    restarted this launch (torchrun's agent), ``engine_restarts``: how many it may
    (None: the engine does not restart).
    """

    def __init__(self, kind, world_size, ranks, rendezvous=None, run_id=None,
                 bind_addr=None, *, host=None, named_by=None, restart=0,
                 engine_restarts=None, agent_store=False, group_size=None, port=0):
        self.kind, self.world_size, self.ranks = kind, world_size, list(ranks)
        self.rendezvous = rendezvous   # None: local, made by the supervisor (or agent store)
        self.run_id = run_id           # names the run directory all launchers share
        self.bind_addr = bind_addr     # None: the config's world.bind_addr
        self.host, self.named_by = host, named_by
        self.restart, self.engine_restarts = restart, engine_restarts
        self.agent_store = agent_store  # rank 0 publishes the rendezvous in torchrun's store
        self.group_size = group_size or world_size  # processes the engine started
        self.port = port  # rank 0's port next to torchrun's store (0: a free one)
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
    elsewhere a launcher cannot know what its neighbours on the same host took (Slurm
    gives each task a cpuset of its own anyway)."""
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


def job_port(job_id):
    """A rendezvous port from a job's id (a number, or any text: its CRC): 15000-29999,
    below Linux's ephemeral range, different for concurrent jobs as far as it can be."""
    try:
        number = int(job_id)
    except ValueError:
        number = zlib.crc32(str(job_id).encode())
    return 15000 + number % 15000


def slurm_port(job_id):
    return job_port(job_id)


def _int_env(env, name):
    value = env.get(name)
    try:
        return int(value)
    except (TypeError, ValueError):
        raise ValueError(f"environment variable {name}={value!r} is not an integer") from None


def _port_env(env, name="MASTER_PORT"):
    port = _int_env(env, name)
    if not 0 < port < 65536:
        raise ValueError(f"{name}={port} is not a port (1-65535)")
    return port


def detect(workers, env=None, force_local=False, port=0):
    """The :class:`Layout` for this process's environment and ``workers`` stages;
    ``port``: where rank 0 serves the rendezvous unless ``MASTER_PORT`` says
    (``world.rendezvous_port``; 0: derived from the job's id, or a free one)."""
    env = os.environ if env is None else env
    world = workers + 1
    if force_local:
        return Layout("local", world, range(world))
    if env.get("RANK") and env.get("TORCHELASTIC_RUN_ID") is not None:
        return _torchrun(env, world, port)
    mpi = _mpi_variables(env)
    if mpi is not None and not _srun_started(env, mpi):
        return _mpi(env, world, mpi, port)
    if env.get("SLURM_PROCID"):
        return _slurm(env, world, port)
    if env.get("RANK"):
        return _env(env, world)
    return Layout("local", world, range(world))


def _torchrun(env, world, port):
    size, rank = _int_env(env, "WORLD_SIZE"), _int_env(env, "RANK")
    if size > world:
        _check_size(size, world, "WORLD_SIZE")
    addr, master = _master(env, "a torchrun launch")
    run_id = env.get("TORCHELASTIC_RUN_ID") or "none"
    agent = env.get("TORCHELASTIC_USE_AGENT_STORE", "").lower() == "true"
    if run_id == "none":  # torchrun's default --rdzv-id: the same for every job
        run_id = None if agent else f"{addr}-{master}"  # None: agreed in the agent's store
    return Layout("torchrun", world, range(rank, world, size),
                  None if agent else addresses.endpoint(addr, master), run_id=run_id,
                  host=addr, named_by="MASTER_ADDR", agent_store=agent,
                  restart=int(env.get("TORCHELASTIC_RESTART_COUNT") or 0),
                  engine_restarts=int(env.get("TORCHELASTIC_MAX_RESTARTS") or 0),
                  group_size=size, port=port)


def _master(env, what):
    addr, port = env.get("MASTER_ADDR"), env.get("MASTER_PORT")
    if not addr or not port:
        raise ValueError(f"RANK is set but MASTER_ADDR/MASTER_PORT are not: {what} needs "
                         "RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT (or pass --local)")
    return addr.strip().strip("[]"), _port_env(env)


def _env(env, world):
    size, rank = _int_env(env, "WORLD_SIZE"), _int_env(env, "RANK")
    _check_size(size, world, "WORLD_SIZE")
    addr, port = _master(env, "a torchrun-style launch")
    return Layout("env", size, [rank], addresses.endpoint(addr, port), run_id=f"{addr}-{port}",
                  host=addr, named_by="MASTER_ADDR")


def _mpi_variables(env):
    for name, rank, size, local in _MPI:
        if env.get(rank) and env.get(size):
            return name, rank, size, next((v for v in local if env.get(v)), None)
    return None


def _srun_started(env, mpi):
    """Whether srun started these MPI ranks itself (``srun --mpi=pmix``): its variables
    then describe them too, and Slurm's way finds rank 0's host."""
    _, rank, size, _ = mpi
    return (env.get("SLURM_STEP_ID") is not None and env.get("SLURM_PROCID") == env.get(rank)
            and env.get("SLURM_NTASKS") == env.get(size))


def _mpi(env, world, mpi, port=0):
    name, rank_var, size_var, local_var = mpi
    size, rank = _int_env(env, size_var), _int_env(env, rank_var)
    _check_size(size, world, size_var)
    one_host = local_var is not None and _int_env(env, local_var) == size
    addr = (env.get("MASTER_ADDR") or "").strip().strip("[]")
    if not addr:
        if not one_host:
            spread = (f"{local_var}={env[local_var]} of {size_var}={size}" if local_var
                      else f"{name} does not say how many ranks run on each host")
            raise ValueError(
                f"the {name} ranks may span hosts ({spread}) and nothing says where rank 0 "
                f"runs: set MASTER_ADDR to rank 0's host for every rank (mpirun -x "
                f"MASTER_ADDR=<host of rank 0>, mpiexec -genv MASTER_ADDR <host>)")
        addr = "127.0.0.1"
    job = next((env[v] for v in _MPI_JOB if env.get(v)), None)
    if env.get("MASTER_PORT"):
        port = _port_env(env)
    elif port or job is not None:
        port = port or job_port(job)
    else:
        raise ValueError(f"{name} names no job id here to derive the rendezvous port from: "
                         "set MASTER_PORT for every rank (mpiexec -genv MASTER_PORT 29500), or "
                         "world.rendezvous_port")
    run_id = "mpi" + re.sub(r"[^A-Za-z0-9_.-]+", "-", job) if job else f"{addr}-{port}"
    return Layout("mpi", size, [rank], addresses.endpoint(addr, port), run_id=run_id,
                  host=addr, named_by="MASTER_ADDR" if env.get("MASTER_ADDR") else
                  f"{local_var}={size}: one host")


def _slurm(env, world, port=0):
    if not (env.get("SLURM_NTASKS") and env.get("SLURM_JOB_ID")):
        raise ValueError("SLURM_PROCID is set but SLURM_NTASKS or SLURM_JOB_ID is not: run "
                         "one launcher per task with srun, or pass --local")
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
    # rank 0 runs on the step's first host (a step may use part of the job's nodes); each
    # process binds its address toward it (utils/addresses.py), whatever its name resolves
    # to on this host
    named_by = next((v for v in ("MASTER_ADDR", "SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST")
                     if env.get(v)), None)
    if named_by is None:
        host, named_by = socket.gethostname(), "this host's name"
    elif named_by == "MASTER_ADDR":
        host = env["MASTER_ADDR"].strip().strip("[]")
    else:
        host = first_host(env[named_by])
    port = _port_env(env) if env.get("MASTER_PORT") else port or slurm_port(env["SLURM_JOB_ID"])
    return Layout("slurm", size, [rank], addresses.endpoint(host, port),
                  run_id=f"slurm{env['SLURM_JOB_ID']}", host=host, named_by=named_by)


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


def check_addresses(layout, bind_addr="auto"):
    """Before anything starts: the rendezvous host resolves here and this host has an
    address toward it (the interface settings name one that exists). Returns a line that
    says where this launcher's processes meet the others; ValueError names the host and
    the setting at fault."""
    here = socket.gethostname()
    try:
        addresses.resolve(layout.host, layout.named_by or "the rendezvous host")
    except addresses.AddressError as e:
        raise ValueError(f"on {here} ({_ranks(layout.ranks, 'rank')}): {e}") from None
    env = {"DISTGRAD_BIND_ADDR": bind_addr} if bind_addr and bind_addr != "auto" else None
    try:
        choice = addresses.choose(layout.host, "rpc", env=env)
    except addresses.AddressError as e:
        raise ValueError(f"on {here} ({_ranks(layout.ranks, 'rank')}): {e}") from None
    where = (f"torchrun's store at {layout.host}" if layout.agent_store else
             f"{layout.host}:{addresses.host_port(layout.rendezvous)[1]}")
    return (f"{_ranks(layout.ranks, 'rank')} on {here} at {choice.advertise} ({choice.why}); "
            f"rendezvous via {where} ({layout.named_by})")


def _ranks(ranks, word=None):
    text = ", ".join(map(str, ranks))
    return text if word is None else f"{word}{'s' if len(ranks) > 1 else ''} {text}"


def _agent_store(env, timeout):
    import torch.distributed as dist  # present wherever PyTorch's torchrun is
    return dist.TCPStore(env["MASTER_ADDR"], int(env["MASTER_PORT"]), is_master=False,
                         timeout=datetime.timedelta(seconds=timeout))


def torchrun_rendezvous(layout, env=None, timeout=60.0):
    """Under PyTorch's torchrun: the run's name and the rendezvous address, agreed in the
    agent's store. The name is the first one any launcher of the job offers (kept across
    the agent's restarts, so a restart continues the same run directory); rank 0 picks a
    free port and publishes ``tcp://host:port``, the other ranks read it from there.
    Sets ``layout.run_id`` (where torchrun gave none) and ``layout.rendezvous``."""
    env = os.environ if env is None else env
    store = _agent_store(env, timeout)
    if layout.run_id is None:
        offer = f"{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:6]}"
        layout.run_id = store.compare_set("distgrad/launch/run_id", "", offer).decode()
    key = f"distgrad/launch/{env.get('TORCHELASTIC_RESTART_COUNT', '0')}/rendezvous"
    if 0 in layout.ranks:
        # rank 0 need not run on MASTER_ADDR's host (the agents' store may be elsewhere)
        host = own_address(addresses.endpoint(env["MASTER_ADDR"], env["MASTER_PORT"]))
        # a free port is closed again just before rank 0 binds it
        address = addresses.endpoint(host, layout.port or free_port(host))
        store.set(key, address)
        layout.rendezvous = address
    else:
        layout.rendezvous = store.get(key).decode()  # waits (up to the timeout) for rank 0
    return layout.rendezvous

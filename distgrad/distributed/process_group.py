"""Process groups: ``init_process_group``, ``new_group``, ranks, ``destroy_process_group``.

``init_process_group`` meets the other processes through a store (as PyTorch
does): with ``env://`` (``MASTER_ADDR``/``MASTER_PORT``, ``RANK``, ``WORLD_SIZE``)
or ``tcp://host:port``, rank 0 serves a :class:`TCPStore` at that address and
every rank connects to it; or the caller passes ``store=``. Through the store
each rank claims its rank (a rank claimed twice, or another ``world_size``, is an
error on every rank that meets it, not a hang), publishes the endpoint of its
communicator and reads everyone's. Then the communicators connect and run a
first collective that proves which peers share memory (and is the barrier).

In every process of the world (a complete program: ``scripts/example_ddp.py``)::

    import distgrad.distributed as dist
    dist.init_process_group("gloo", init_method="tcp://127.0.0.1:29500",
                            rank=rank, world_size=2)
    dist.all_reduce(t)

PyTorch's CPU backend names (``"gloo"``, ``None``) and ``"zmq"`` select this
backend. Groups made with ``new_group`` share the world's communicator; every
process calls ``new_group`` in the same order (members and not), as in PyTorch.
"""
import datetime
import hashlib
import os
import time
import urllib.parse
import warnings

from distgrad.rpc.rendezvous import resolve_address
from distgrad.rpc.rendezvous_file import file_path
from distgrad.utils import addresses

from . import comm as _comm
from . import members
from .agent_store import attempt_store, uses_agent_store
from .errors import DistError, DistNetworkError, DistStoreError
from .file_store import FileStore
from .programs import shm_handshake
from .store import PrefixStore, Store, TCPStore, seconds
from .work import Work

__all__ = ["Backend", "ProcessGroup", "GroupMember", "group", "init_process_group",
           "destroy_process_group", "new_group", "is_initialized", "is_available",
           "is_gloo_available", "is_nccl_available", "is_mpi_available", "is_ucc_available",
           "is_backend_available", "is_torchelastic_launched", "get_rank", "get_world_size",
           "get_backend", "get_global_rank", "get_group_rank", "get_process_group_ranks",
           "default_pg_timeout", "get_default_group", "default_store"]

default_pg_timeout = datetime.timedelta(minutes=30)


class Backend(str):
    """A backend name. ``"gloo"`` (PyTorch's CPU backend) and ``"zmq"`` are this one;
    ``"nccl"``, ``"ucc"`` and ``"mpi"`` exist by name only (distgrad is CPU only)."""

    UNDEFINED = "undefined"
    GLOO = "gloo"
    NCCL = "nccl"
    UCC = "ucc"
    MPI = "mpi"
    ZMQ = "zmq"
    backend_list = [UNDEFINED, GLOO, NCCL, UCC, MPI, ZMQ]

    def __new__(cls, name):
        if not isinstance(name, str):
            raise ValueError(f"Backend name must be a string, but got: {name}")
        value = name.lower()
        if value not in cls.backend_list and ":" not in value:
            raise ValueError(f"Invalid backend: '{name}'")
        return super().__new__(cls, value)


def _select_backend(backend):
    """The backend name this world reports, after PyTorch's checks of ``backend``."""
    if backend is None:
        return Backend.GLOO
    name = Backend(backend)
    if ":" in name:  # "cpu:gloo,cuda:nccl": the CPU part decides
        parts = dict(p.split(":", 1) for p in name.split(",") if ":" in p)
        cpu = parts.get("cpu")
        if cpu not in (Backend.GLOO, Backend.ZMQ):
            raise RuntimeError(f"backend {backend!r} has no CPU backend distgrad runs "
                               "(use cpu:gloo)")
        return Backend(cpu)
    if name in (Backend.GLOO, Backend.ZMQ):
        return name
    if name == Backend.UNDEFINED:
        return Backend.GLOO
    raise RuntimeError(f"Distributed package doesn't have {name.upper()} built in "
                       "(distgrad is CPU only: use backend='gloo')")


class ProcessGroup:
    """A group of ranks that run collectives together (``torch.distributed.ProcessGroup``).

    ``rank()`` and ``size()`` are this process's rank in the group and the group's size.
    """

    def __init__(self, world, ranks, state, backend, name, desc):
        self._world = world
        self._ranks = list(ranks)
        self._state = state           # comm.Group, or None in a one-process world
        self._backend = backend
        self.group_name = name
        self.group_desc = desc
        self.bound_device_id = None

    def rank(self):
        return self._ranks.index(self._world.rank)

    def size(self):
        return len(self._ranks)

    def name(self):
        return self._backend

    def __repr__(self):
        return f"ProcessGroup(ranks={self._ranks}, rank={self.rank()}, backend={self._backend!r})"


class _NonMember:
    def __repr__(self):
        return "GroupMember.NON_GROUP_MEMBER"


class _WorldMeta(type):
    @property
    def WORLD(cls):  # noqa: N802 - PyTorch's name
        return _world.default_pg


class GroupMember(metaclass=_WorldMeta):
    """``GroupMember.WORLD`` (the default group) and ``GroupMember.NON_GROUP_MEMBER``
    (what ``new_group`` returns to processes outside the group)."""
    NON_GROUP_MEMBER = _NonMember()


class group(metaclass=_WorldMeta):  # noqa: N801 - PyTorch's ``dist.group.WORLD``
    pass


class _World:
    """This process's process-group world (one at a time, as in PyTorch)."""

    def __init__(self):
        self.reset()

    def reset(self):
        self.default_pg = None
        self.comm = None
        self.rank = -1
        self.size = -1
        self.store = None
        self.own_store = None
        self.backend = None
        self.timeout = None
        self.groups = {}         # ProcessGroup -> ranks (members only)
        self.counts = {}         # tuple(ranks) -> groups with these ranks made so far


_world = _World()


def _group_id(ranks, nth):
    """The same id on every member: from the ranks and how many groups with exactly these
    ranks came before (so members agree even if non-members never call new_group)."""
    digest = hashlib.blake2b(f"{','.join(map(str, ranks))}#{nth}".encode(), digest_size=8)
    return int.from_bytes(digest.digest(), "big") >> 1


def _own_address(host):
    """Where this rank binds and what it advertises (``utils/addresses.py``): toward the
    master ``host``, unless DISTGRAD_BIND_ADDR, DISTGRAD_SOCKET_IFNAME or
    GLOO_SOCKET_IFNAME say otherwise."""
    try:
        return addresses.choose(host, "pg")
    except addresses.AddressError as e:
        raise DistNetworkError(f"cannot choose this rank's address: {e}") from None


def _from_env(name, given):
    if given is not None and given >= 0:
        return given
    value = os.environ.get(name)
    if value is None:
        raise ValueError(f"Error initializing torch.distributed using env:// rendezvous: "
                         f"environment variable {name} expected, but not set")
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"environment variable {name} must be an integer, not "
                         f"{value!r}") from None


def _store_from_init_method(init_method, rank, world_size, timeout):
    """(store, what to close, rank, world_size, master host) of an ``env://``, ``tcp://`` or
    ``file://`` init method (a file store: ranks on one machine, or on one shared file
    system). Under a torchrun agent that serves the store (``TORCHELASTIC_USE_AGENT_STORE``)
    every rank is a client of the agent's, as in PyTorch."""
    url = urllib.parse.urlparse(init_method)
    query = dict(urllib.parse.parse_qsl(url.query))
    if url.scheme == "file":
        rank = int(query.get("rank", rank))
        world_size = int(query.get("world_size", world_size))
        path = file_path(init_method)
        if rank < 0 or world_size < 1:
            raise ValueError("file:// init_method needs rank and world_size (arguments, or "
                             "?rank=..&world_size=.. in the URL)")
        _check_rank(rank, world_size)
        store = FileStore(path, world_size)
        return store, store, rank, world_size, None
    if url.scheme == "env":
        rank = _from_env("RANK", rank if rank >= 0 else None)
        world_size = _from_env("WORLD_SIZE", world_size if world_size >= 0 else None)
        address = resolve_address("env://")
    elif url.scheme == "tcp":
        rank = int(query.get("rank", rank))
        world_size = int(query.get("world_size", world_size))
        if url.hostname is None or url.port is None:
            raise ValueError(f"init_method {init_method!r} must be tcp://host:port")
        address = addresses.endpoint(url.hostname, url.port)
        if rank < 0 or world_size < 1:
            raise ValueError("tcp:// init_method needs rank and world_size (arguments, or "
                             "?rank=..&world_size=.. in the URL)")
    else:
        raise ValueError(f"init_method {init_method!r} is not supported: use env://, "
                         "tcp://host:port or file:///path (or pass store=)")
    host, port = addresses.host_port(address)
    _check_rank(rank, world_size)
    if uses_agent_store():
        store, client = attempt_store(host, int(port), timeout)
        return store, client, rank, world_size, host
    store = TCPStore(host, int(port), world_size, is_master=rank == 0, timeout=timeout,
                     wait_for_workers=False, multi_tenant=True)
    return store, store, rank, world_size, host


def _check_rank(rank, world_size):
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
        raise ValueError(f"world_size must be a positive integer, not {world_size!r}")
    if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < world_size:
        raise ValueError(f"rank {rank!r} is out of range for world_size {world_size}")


def _meet(store, rank, world_size, entry, timeout, file=None):
    """Claim ``rank``, publish its ``entry`` (``members.py``), return every rank's (via
    ``store``; ``file``: the file of a file:// init method, which an earlier run may have
    left)."""
    def fail(msg):
        store.set("error", msg)
        raise DistError(msg)

    claims = store.add(f"rank/{rank}", 1)
    if claims > 1:
        stale = (f", or the file {file!r} was left behind by an earlier run: remove it (each "
                 "run needs a file of its own)" if file else "")
        fail(f"rank {rank} was claimed by {claims} processes (each process needs its own rank "
             f"in 0..{world_size - 1}{stale})")
    agreed = store.compare_set("world_size", "", str(world_size)).decode()
    if agreed != str(world_size):
        fail(f"rank {rank} was started with world_size {world_size}, but another process with "
             f"world_size {agreed}")
    store.set(f"member/{rank}", entry)
    keys = [f"member/{r}" for r in range(world_size)]
    deadline = time.monotonic() + timeout
    while True:
        try:
            store.wait(keys, min(0.5, max(deadline - time.monotonic(), 0.01)))
            break
        except DistStoreError:
            if store.check(["error"]):
                raise DistError(store.get("error").decode()) from None
            if time.monotonic() >= deadline:
                missing = [r for r, k in enumerate(keys) if not store.check([k])]
                raise DistError(f"init_process_group timed out after {timeout:g} s on rank "
                                f"{rank}: ranks {missing[:16]} of {world_size} did not "
                                "join") from None
    return store.multi_get(keys)


def init_process_group(backend=None, init_method=None, timeout=None, world_size=-1, rank=-1,
                       store=None, group_name="", pg_options=None, device_id=None):
    """Join the default process group (``torch.distributed.init_process_group``)."""
    if _world.default_pg is not None:
        raise ValueError("trying to initialize the default process group twice!")
    name = _select_backend(backend)
    timeout_s = seconds(timeout, default_pg_timeout.total_seconds())
    host = None
    own_store = None
    if store is None:
        store, own_store, rank, world_size, host = _store_from_init_method(
            init_method or "env://", rank, world_size, timeout_s)
    else:
        if init_method is not None:
            raise ValueError("Cannot specify both init_method and store.")
        if not isinstance(store, Store):
            raise TypeError(f"store must be a distgrad.distributed.Store, not "
                            f"{type(store).__name__}")
        if world_size <= 0:
            raise ValueError("world_size must be positive if using store")
        if rank < 0:
            raise ValueError("rank must be non-negative if using store")
        _check_rank(rank, world_size)
        host = getattr(store, "host", None)
    comm = None
    try:
        pg_store = PrefixStore(f"distgrad_pg/{group_name or 'default'}", store)
        if world_size > 1:
            interval = getattr(pg_options, "heartbeat_interval", 0.5)
            comm = _comm.Communicator(rank, world_size, heartbeat_interval=interval,
                                      heartbeat_timeout=getattr(pg_options, "heartbeat_timeout",
                                                                max(3.0, 4 * interval)),
                                      address=_own_address(host),
                                      simulated_link=getattr(pg_options, "simulated_link", None))
            secret = members.secret_for(comm.options, store, rank, world_size)
            mine = members.entry(rank, world_size, comm.bind(), comm.verifier, secret)
            entries = _meet(pg_store, rank, world_size, mine, timeout_s,
                            getattr(own_store, "path", None))
            endpoints, verifiers = members.admitted(entries, world_size, secret)
            comm.connect(endpoints, verifiers)
            members.warn_if_open(comm.options, store, rank, world_size, secret, endpoints)
        _world.comm, _world.rank, _world.size = comm, rank, world_size
        _world.store, _world.own_store = store, own_store
        _world.backend, _world.timeout = name, timeout_s
        ranks = list(range(world_size))
        pg = _make_group(ranks, timeout_s, group_name or "default", None)
        _world.default_pg = pg
        if comm is not None:
            fp = ["init_process_group", [], [], []]
            comm.submit(pg._state, fp, shm_handshake(comm), Work(), needs_left=False).wait()
    except BaseException:
        if comm is not None:
            comm.close(timeout=0)
        if own_store is not None:
            own_store.close()
        _world.reset()
        raise


def _make_group(ranks, timeout, name, desc):
    key = tuple(ranks)
    nth = _world.counts.get(key, 0)
    _world.counts[key] = nth + 1
    if _world.rank not in ranks:
        return GroupMember.NON_GROUP_MEMBER
    state = None
    if _world.comm is not None and len(ranks) > 1:
        state = _world.comm.add_group(_group_id(ranks, nth), ranks, timeout, name)
    pg = ProcessGroup(_world, ranks, state, _world.backend, name, desc)
    _world.groups[pg] = ranks
    return pg


def is_initialized():
    return _world.default_pg is not None


def is_available():
    return True


def is_gloo_available():
    return True  # "gloo" selects this backend


def is_nccl_available():
    return False


def is_mpi_available():
    return False


def is_ucc_available():
    return False


def is_backend_available(backend):
    return backend is not None and str(backend).lower() in (Backend.GLOO, Backend.ZMQ)


def is_torchelastic_launched():
    return os.getenv("TORCHELASTIC_RUN_ID") is not None


def get_default_group():
    if _world.default_pg is None:
        raise ValueError("Default process group has not been initialized, please make sure to "
                         "call init_process_group.")
    return _world.default_pg


def default_store():
    """The store the default group met through (PyTorch's ``_get_default_store``)."""
    get_default_group()
    return _world.store


def resolve_group(group):
    """``group`` (None: the default one) after checking the world is up."""
    default = get_default_group()
    if group is None or group is default:
        return default
    if group is GroupMember.NON_GROUP_MEMBER:
        return group
    if not isinstance(group, ProcessGroup) or group not in _world.groups:
        raise ValueError(f"Invalid process group specified: {group!r}")
    return group


def new_group(ranks=None, timeout=None, backend=None, pg_options=None,
              use_local_synchronization=False, group_desc=None, device_id=None,
              sort_ranks=True):
    """A group of some of the world's ranks. Every process calls it, in the same order
    (with ``use_local_synchronization=True`` only the members need to)."""
    get_default_group()
    if backend is not None:
        _select_backend(backend)
    if ranks is None:
        ranks = list(range(_world.size))
    ranks = [int(r) for r in ranks]
    if sort_ranks:
        ranks = sorted(ranks)
    if len(set(ranks)) != len(ranks):
        raise ValueError(f"new_group(): ranks {ranks} contain duplicates")
    for r in ranks:
        if not 0 <= r < _world.size:
            raise ValueError(f"new_group(): rank {r} is out of range for world_size "
                             f"{_world.size}")
    if not ranks:
        raise ValueError("new_group(): ranks must not be empty")
    t = seconds(timeout, _world.timeout)
    return _make_group(ranks, t, group_desc or f"group{len(_world.groups)}", group_desc)


def destroy_process_group(group=None):
    """Leave the world (``group=None``: every group goes, peers are told) or forget one
    group of it."""
    if _world.default_pg is None:
        raise ValueError("Default process group has not been initialized, please make sure "
                         "to call init_process_group.")
    if group is None or group is _world.default_pg:
        comm, store = _world.comm, _world.own_store
        _world.reset()
        if comm is not None:
            comm.close()
        if store is not None:
            store.close()
        return
    if group is GroupMember.NON_GROUP_MEMBER:
        return
    if group not in _world.groups:
        raise ValueError(f"Invalid process group specified: {group!r}")
    del _world.groups[group]
    if group._state is not None:
        _world.comm.remove_group(group._state.gid)


def _warn_not_in_group(op_name):
    warnings.warn(f"Running {op_name} on global rank {_world.rank} which does not belong to "
                  "the given group.", stacklevel=3)


def get_rank(group=None):
    g = resolve_group(group)
    if g is GroupMember.NON_GROUP_MEMBER:
        return -1
    return g.rank()


def get_world_size(group=None):
    g = resolve_group(group)
    if g is GroupMember.NON_GROUP_MEMBER:
        return -1
    return g.size()


def get_backend(group=None):
    g = resolve_group(group)
    if g is GroupMember.NON_GROUP_MEMBER:
        raise ValueError("Invalid process group specified")
    return Backend(g._backend)


def get_process_group_ranks(group):
    g = resolve_group(group)
    if g is GroupMember.NON_GROUP_MEMBER:
        raise ValueError("Invalid process group specified")
    return list(g._ranks)


def get_global_rank(group, group_rank):
    ranks = get_process_group_ranks(group)
    if not 0 <= group_rank < len(ranks):
        raise ValueError(f"Group rank {group_rank} is not part of group {ranks}")
    return ranks[group_rank]


def get_group_rank(group, global_rank):
    ranks = get_process_group_ranks(group)
    if global_rank not in ranks:
        raise ValueError(f"Global rank {global_rank} is not part of group {ranks}")
    return ranks.index(global_rank)

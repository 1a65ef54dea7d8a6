"""The process-level RPC API (``torch.distributed.rpc``'s functions)."""
import enum
import os
import sys

from . import current
from .agent import Agent
from .options import RpcBackendOptions

__all__ = ["init_rpc", "shutdown", "rpc_sync", "rpc_async", "remote", "get_worker_info",
           "BackendType", "is_available"]


class BackendType(enum.Enum):
    TENSORPIPE = "TENSORPIPE"
    ZMQ = "TENSORPIPE"


def is_available():
    return True


def _env_int(name):
    v = os.environ.get(name)
    if v in (None, ""):
        return None
    try:
        return int(v)
    except ValueError:
        raise ValueError(f"environment variable {name}={v!r} is not an integer") from None


def _caller_module(depth):
    """The module of the code that called init_rpc (trusted: every process runs it)."""
    try:
        name = sys._getframe(depth).f_globals.get("__name__")
    except ValueError:
        return None
    if not isinstance(name, str) or name == "distgrad" or name.startswith("distgrad."):
        return None
    return name


def init_rpc(name, backend=None, rank=None, world_size=None, rpc_backend_options=None,
             _rendezvous_server=None):
    """Join the RPC world as ``name``; every process of the world calls it.

    ``rank``/``world_size`` default to the ``RANK``/``WORLD_SIZE`` environment
    variables; the rendezvous address comes from ``rpc_backend_options.init_method``
    or ``MASTER_ADDR``/``MASTER_PORT`` (or ``DISTGRAD_COORDINATOR``). The module
    that calls ``init_rpc`` is trusted for calls from peers (its functions may be
    called remotely), as are ``rpc_backend_options.allowed_modules``.
    """
    if isinstance(backend, int) and not isinstance(backend, bool) and world_size is None:
        backend, rank, world_size = None, backend, rank  # init_rpc(name, rank, world_size)
    if rank is None or rank < 0:
        rank = _env_int("RANK")
    if world_size is None:
        world_size = _env_int("WORLD_SIZE")
    if rank is None or world_size is None:
        raise ValueError("init_rpc needs rank and world_size (arguments or RANK/WORLD_SIZE)")
    a = current.current_agent()
    if a is not None and a.running:
        raise RuntimeError("init_rpc was already called in this process (call shutdown first)")
    agent = Agent(name, rank, world_size, rpc_backend_options or RpcBackendOptions())
    caller = _caller_module(2)
    if caller is not None:
        agent.allowlist.extend([caller])
    # Installed before it starts: a peer's first call can reach a handler (which may call
    # get_worker_info()) while start() is still finishing. A failed start uninstalls it.
    current.install(agent)
    agent.start(_rendezvous_server)


def _need():
    a = current.current_agent()
    if a is None or not a.running:
        raise RuntimeError("RPC has not been initialized. Call "
                           "distgrad.distributed.rpc.init_rpc first.")
    return a


def shutdown(graceful=True, timeout=0):
    """Leave the world; graceful waits for every worker's outstanding work (a barrier)."""
    a = current.current_agent()
    if a is None:
        return
    a.shutdown(graceful=graceful, timeout=timeout or None)


def get_worker_info(worker_name=None):
    return _need().worker_info(worker_name)


def rpc_async(to, func, args=None, kwargs=None, timeout=-1):
    """Run ``func(*args, **kwargs)`` on worker ``to``; return a Future of the result."""
    return _need().call(to, func, args or (), kwargs, timeout)


def rpc_sync(to, func, args=None, kwargs=None, timeout=-1):
    """Run ``func(*args, **kwargs)`` on worker ``to`` and return its result."""
    return _need().call_sync(to, func, args or (), kwargs, timeout)


def _set_rpc_timeout(rpcTimeoutSeconds):  # noqa: N803 - PyTorch's parameter name
    """Set the default timeout, in seconds, of this process's later RPCs (0: none), as
    PyTorch's ``rpc._set_rpc_timeout``; calls given a ``timeout`` keep theirs."""
    agent = _need()
    if isinstance(rpcTimeoutSeconds, bool) or not isinstance(rpcTimeoutSeconds, (int, float)) \
            or rpcTimeoutSeconds < 0:
        raise ValueError(f"rpc._set_rpc_timeout: the timeout must be a number of seconds >= 0, "
                         f"not {rpcTimeoutSeconds!r}")
    # the agent's own options (a copy of init_rpc's), shared by its parts
    agent.options.rpc_timeout = float(rpcTimeoutSeconds)


def _get_rpc_timeout():
    """The default timeout, in seconds, of this process's RPCs (0: none)."""
    return _need().options.rpc_timeout


def remote(to, func, args=None, kwargs=None, timeout=-1):
    """Run ``func`` on ``to`` and keep the result there; return an RRef to it."""
    return _need().remote(to, func, args or (), kwargs, timeout)

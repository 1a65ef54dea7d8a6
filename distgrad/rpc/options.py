"""Options of the RPC backend (PyTorch's ``TensorPipeRpcBackendOptions`` equivalent)."""
from dataclasses import dataclass, field
from typing import Optional, Sequence

from .link import parse_link

__all__ = ["RpcBackendOptions", "TensorPipeRpcBackendOptions", "generate_curve_keypair"]


@dataclass
class RpcBackendOptions:
    """Settings of one process's RPC agent.

    ``init_method``: ``"env://"`` (MASTER_ADDR/MASTER_PORT or DISTGRAD_COORDINATOR),
    ``"tcp://host:port"``, ``"ipc:///path"``: where the rendezvous runs, or
    ``"file:///path"``: a file through which rank 0 tells the others where it runs.
    ``transport``: ``"tcp"`` or ``"ipc"`` for this process's own endpoint.
    ``bind_addr``: the address its tcp endpoint binds and advertises; None (default): the
    address of this host on the route toward the rendezvous host (127.0.0.1 for a
    rendezvous on loopback), unless ``DISTGRAD_BIND_ADDR``, ``DISTGRAD_SOCKET_IFNAME`` or
    ``TP_SOCKET_IFNAME`` say otherwise (see ``utils/addresses.py``); ``"0.0.0.0"``
    binds every interface.
    ``rpc_timeout``: default per-call timeout in seconds (0 = no timeout).
    ``num_worker_threads``: handler threads kept ready; more start whenever every
    thread is busy, so nested calls cannot deadlock.
    ``allowed_modules``: module names (and their submodules) whose functions and
    classes peers may call here, on top of distgrad's own entry points and the
    module that called ``init_rpc`` (see ``allowlist.py``).
    ``authenticate``: admit only connections of the world's members, each as its own
    rank, and refuse a message whose source is not its connection's (see
    ``rpc/credentials.py``; on by default, off only for measurements and clients that
    speak the protocol by hand). ``world_secret``: the world's secret (text), which
    every member must hold to join; default: the ``DISTGRAD_WORLD_SECRET`` environment
    variable (``distgrad launch``, ``distributed.run``, ``multiprocessing.spawn`` and the
    test harness set it; a ``file://`` rendezvous hands one), else none: the world is
    closed once it formed, but anyone who reaches the rendezvous while it forms may join
    (a warning says so once; ``DISTGRAD_REQUIRE_SECRET=1`` makes it an error).
    ``curve_public_key``/``curve_secret_key``: a shared world key pair (Z85 bytes,
    from :func:`generate_curve_keypair`); with it the rendezvous runs CURVE (only
    processes holding the secret key can join) and every connection is encrypted,
    with a key pair of each process's own: for networks others can read.
    ``heartbeat_interval``/``heartbeat_timeout``: seconds between ZMTP heartbeats,
    and how long a stopped or unreachable peer may stay silent before it is
    reported dead (a killed one is reported within ~0.2 s).
    ``max_message_size``: largest accepted message part in bytes (a peer sending
    more is disconnected); ``max_inflight_per_worker``: calls to one worker in
    flight at once before a further call waits (``backpressure="block"``) or
    raises :class:`BackpressureError` (``"raise"``).
    ``shm_threshold``: arrays of at least this many bytes travel through shared
    memory to peers proven to share it (0 turns the path off);
    ``shm_pool_bytes``: the most shared memory this process lends at once.
    ``simulated_link``: ``"<latency> <bandwidth>"`` (``"200us 10Gbit/s"``, ``"2ms
    1Gbit/s"``): every message from another process is held until it would have arrived
    over such a link, and shared memory is not used (see ``rpc/link.py``); for measuring
    on one machine what a world spread over hosts would see. None: no simulation.
    """
    num_worker_threads: int = 16
    rpc_timeout: float = 60.0
    init_method: str = "env://"
    transport: str = "tcp"
    bind_addr: Optional[str] = None
    allowed_modules: Sequence[str] = ()
    authenticate: bool = True
    world_secret: Optional[str] = None
    curve_public_key: Optional[bytes] = None
    curve_secret_key: Optional[bytes] = None
    heartbeat_interval: float = 0.5
    heartbeat_timeout: float = 3.0
    rendezvous_timeout: float = 60.0
    max_message_size: int = 1 << 30
    max_inflight_per_worker: int = 1024
    backpressure: str = "block"
    shm_threshold: int = 1 << 20
    shm_pool_bytes: int = 1 << 30
    ipc_dir: Optional[str] = None
    simulated_link: Optional[str] = None
    device_maps: dict = field(default_factory=dict)  # accepted for torch compatibility
    devices: Sequence = ()

    def __post_init__(self):
        if self.transport not in ("tcp", "ipc"):
            raise ValueError(f"transport must be 'tcp' or 'ipc', not {self.transport!r}")
        if self.backpressure not in ("block", "raise"):
            raise ValueError(f"backpressure must be 'block' or 'raise', not {self.backpressure!r}")
        if (self.curve_public_key is None) != (self.curve_secret_key is None):
            raise ValueError("curve_public_key and curve_secret_key must be given together")
        for name, low in (("rpc_timeout", 0), ("heartbeat_interval", 0.01),
                          ("heartbeat_timeout", 0.1), ("rendezvous_timeout", 0.1),
                          ("num_worker_threads", 1), ("max_message_size", 1024),
                          ("max_inflight_per_worker", 1), ("shm_threshold", 0),
                          ("shm_pool_bytes", 0)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value < low:
                raise ValueError(f"RpcBackendOptions.{name} must be a number >= {low}, "
                                 f"not {value!r}")
        if self.heartbeat_timeout < 2 * self.heartbeat_interval:
            raise ValueError("heartbeat_timeout must be at least twice heartbeat_interval")
        if not isinstance(self.authenticate, bool):
            raise ValueError(f"RpcBackendOptions.authenticate must be True or False, not "
                             f"{self.authenticate!r}")
        if self.world_secret is not None and (not isinstance(self.world_secret, (str, bytes))
                                              or not self.world_secret):
            raise ValueError("RpcBackendOptions.world_secret must be a non-empty text")
        if self.simulated_link is not None:
            parse_link(self.simulated_link)  # a malformed link is refused here, named
        if isinstance(self.allowed_modules, str):
            self.allowed_modules = (self.allowed_modules,)

    @property
    def mechanism(self):
        """How connections authenticate: "curve", "plain", or "none" (turned off)."""
        if self.curve_public_key is not None:
            return "curve"
        return "plain" if self.authenticate else "none"

    def set_device_map(self, to, device_map):  # torch compatibility; CPU only
        self.device_maps[to] = dict(device_map)

    def set_devices(self, devices):
        self.devices = list(devices)


TensorPipeRpcBackendOptions = RpcBackendOptions


def generate_curve_keypair():
    """Return a (public, secret) CURVE key pair in Z85 bytes."""
    import zmq
    return zmq.curve_keypair()

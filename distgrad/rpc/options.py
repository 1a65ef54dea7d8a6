"""Options of the RPC backend (PyTorch's ``TensorPipeRpcBackendOptions`` equivalent)."""
from dataclasses import dataclass, field
from typing import Optional, Sequence

__all__ = ["RpcBackendOptions", "TensorPipeRpcBackendOptions", "DEFAULT_ALLOWED_MODULES",
           "generate_curve_keypair"]

#: Modules whose callables a worker runs by default: the package itself and the
#: side-effect-free ``operator`` module (``_operator`` is where its functions live).
DEFAULT_ALLOWED_MODULES = ("distgrad", "operator", "_operator")


@dataclass
class RpcBackendOptions:
    """Settings of one process's RPC agent.

    ``init_method``: ``"env://"`` (MASTER_ADDR/MASTER_PORT or DISTGRAD_COORDINATOR),
    ``"tcp://host:port"`` or ``"ipc:///path"``: where the rendezvous runs.
    ``transport``: ``"tcp"`` or ``"ipc"`` for this process's own endpoint.
    ``rpc_timeout``: default per-call timeout in seconds (0 = no timeout).
    ``num_worker_threads``: handler threads kept ready (at most 4 start eagerly);
    more start whenever every thread is busy, so nested calls cannot deadlock.
    ``allowed_modules``: extra module names (and their submodules) whose callables
    may be run on this worker, on top of :data:`DEFAULT_ALLOWED_MODULES`.
    ``curve_public_key``/``curve_secret_key``: a shared world key pair (Z85 bytes,
    from :func:`generate_curve_keypair`); with it every socket uses CURVE and only
    processes holding the secret key can connect.
    """
    num_worker_threads: int = 16
    rpc_timeout: float = 60.0
    init_method: str = "env://"
    transport: str = "tcp"
    bind_addr: str = "127.0.0.1"
    allowed_modules: Sequence[str] = ()
    curve_public_key: Optional[bytes] = None
    curve_secret_key: Optional[bytes] = None
    heartbeat_interval: float = 0.5
    heartbeat_timeout: float = 3.0
    rendezvous_timeout: float = 60.0
    max_message_size: int = 4 << 30
    ipc_dir: Optional[str] = None
    device_maps: dict = field(default_factory=dict)  # accepted for torch compatibility
    devices: Sequence = ()

    def __post_init__(self):
        if self.transport not in ("tcp", "ipc"):
            raise ValueError(f"transport must be 'tcp' or 'ipc', not {self.transport!r}")
        if (self.curve_public_key is None) != (self.curve_secret_key is None):
            raise ValueError("curve_public_key and curve_secret_key must be given together")
        if self.heartbeat_timeout <= self.heartbeat_interval:
            raise ValueError("heartbeat_timeout must exceed heartbeat_interval")

    def set_device_map(self, to, device_map):  # torch compatibility; CPU only
        self.device_maps[to] = dict(device_map)

    def set_devices(self, devices):
        self.devices = list(devices)


TensorPipeRpcBackendOptions = RpcBackendOptions


def generate_curve_keypair():
    """Return a (public, secret) CURVE key pair in Z85 bytes."""
    import zmq
    return zmq.curve_keypair()

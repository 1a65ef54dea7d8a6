"""RPC over ZeroMQ: framing, transport, calls, dispatch, RRefs, and the agent that wires them.

The public, PyTorch-named surface is ``distgrad.distributed.rpc``; see
``agent.py`` for the layers and ``PROTOCOL.md`` for the wire format.
"""
from . import interceptors
from . import profiling as _profiling  # noqa: F401 - profiled calls record where they run
from .allowlist import entry_point
from .api import (BackendType, get_worker_info, init_rpc, is_available, remote, rpc_async,
                  rpc_sync, shutdown)
from .current import current_agent
from .dispatch import Request
from .errors import (BackpressureError, ProtocolError, RefusedCallError, RemoteError, RpcError,
                     RpcTimeoutError, UnknownWorkerError, UnsendableError, WorkerUnreachableError)
from ..futures import Future
from .options import RpcBackendOptions, TensorPipeRpcBackendOptions, generate_curve_keypair
from .rref import RRef
from .worker_info import WorkerInfo

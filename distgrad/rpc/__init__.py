"""RPC over ZeroMQ: wire codec, agent, rendezvous, futures and RRefs.

The public, PyTorch-named surface is ``distgrad.distributed.rpc``.
"""
from .agent import current_agent, get_message_interceptor, set_message_interceptor
from .api import (BackendType, get_worker_info, init_rpc, is_available, remote, rpc_async,
                  rpc_sync, shutdown)
from .errors import (ProtocolError, RefusedCallError, RemoteError, RpcError, RpcTimeoutError,
                     WorkerUnreachableError)
from .futures import Future
from .options import RpcBackendOptions, TensorPipeRpcBackendOptions, generate_curve_keypair
from .rref import RRef
from .worker_info import WorkerInfo

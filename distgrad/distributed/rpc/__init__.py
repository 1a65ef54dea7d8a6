"""``torch.distributed.rpc`` for distgrad: swap the import and the program runs.

>>> import distgrad.distributed.rpc as rpc   # instead of torch.distributed.rpc
"""
from distgrad.rpc import functions  # noqa: F401
from distgrad.rpc.api import (BackendType, get_worker_info, init_rpc, is_available, remote,
                              rpc_async, rpc_sync, shutdown)
from distgrad.rpc.api import _get_rpc_timeout, _set_rpc_timeout  # noqa: F401 - PyTorch's too
from distgrad.rpc.errors import (BackpressureError, RefusedCallError, RemoteError, RpcError,
                                 RpcTimeoutError, WorkerUnreachableError)
from distgrad.futures import Future
from distgrad.rpc.options import (RpcBackendOptions, TensorPipeRpcBackendOptions,
                                  generate_curve_keypair)
from distgrad.rpc.rref import RRef
from distgrad.rpc.worker_info import WorkerInfo

PyRRef = RRef

__all__ = ["init_rpc", "shutdown", "rpc_sync", "rpc_async", "remote", "get_worker_info",
           "RRef", "PyRRef", "WorkerInfo", "Future", "RpcBackendOptions",
           "TensorPipeRpcBackendOptions", "BackendType", "functions", "is_available",
           "RpcError", "RpcTimeoutError", "WorkerUnreachableError", "RemoteError",
           "RefusedCallError", "BackpressureError",
           "generate_curve_keypair"]

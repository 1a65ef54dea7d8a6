"""What PyTorch's dist_autograd tests take from ``torch.testing._internal``, on public API.

``dist_autograd_cases.py`` imports these instead of PyTorch's test internals, so its
bodies run unchanged on PyTorch and on distgrad (``import torch`` is distgrad there):

* ``RpcAgentTestFixture``: PyTorch's fixture for the TensorPipe agent (4 ranks, file
  init for the process group and, in a second file, for RPC, its shutdown and timeout
  regexes) on a ``unittest.TestCase`` whose
  ``assertEqual`` compares tensors as PyTorch's ``TestCase`` does: same layout, dtype
  and shape, values within the dtype's default tolerance, sparse tensors by their
  coalesced indices and values;
* ``dist_init``, ``initialize_pg``, ``worker_name``, ``wait_until_node_failure``:
  ``torch/testing/_internal/dist_utils.py``'s, with the same behaviour;
* the skip decorators of the CUDA and macOS tests.

``runner.py`` sets ``rank`` and ``file_name`` on each test instance, as PyTorch's
``MultiProcessTestCase`` does in the process it spawns for a rank.
"""
import re
import sys
import time
import unittest
from functools import partial, wraps

import torch
import torch.distributed as dist
import torch.distributed.rpc as rpc

#: Whether ``torch`` is distgrad here (under ``python -m distgrad.compat.as_torch``).
ON_DISTGRAD = torch.__name__ == "distgrad"
#: The module of the test bodies: on distgrad its functions are called remotely, so its
#: workers allow it (PyTorch unpickles any function; distgrad resolves allowed ones).
CASES_MODULE = "dist_autograd_cases"

IS_MACOS = sys.platform == "darwin"


def skip_but_pass_in_sandcastle_if(condition, reason):
    return unittest.skipIf(condition, reason)


def skip_if_lt_x_gpu(x):
    return unittest.skip(f"needs {x} GPUs (CPU only here)")


def dist_init(old_test_method=None, setup_rpc=True, clean_shutdown=True, faulty_messages=None,
              messages_to_delay=None):
    """PyTorch's ``dist_init``: join the RPC world before the test and leave it after.

    The wrapper records ``clean_shutdown``: a test that does not shut down cleanly
    leaves its world unusable, so the runner starts a fresh one after it.
    """
    if old_test_method is None:
        return partial(dist_init, setup_rpc=setup_rpc, clean_shutdown=clean_shutdown,
                       faulty_messages=faulty_messages, messages_to_delay=messages_to_delay)

    @wraps(old_test_method)
    def new_test_method(self, *arg, **kwargs):
        self.worker_id = self.rank
        if setup_rpc:
            rpc.init_rpc(name=f"worker{self.rank:d}", backend=self.rpc_backend, rank=self.rank,
                         world_size=self.world_size,
                         rpc_backend_options=self.rpc_backend_options)
        return_value = old_test_method(self, *arg, **kwargs)
        if setup_rpc:
            rpc.shutdown(graceful=clean_shutdown)
        return return_value

    new_test_method.clean_shutdown = clean_shutdown
    return new_test_method


def noop():
    pass


def wait_until_node_failure(rank, expected_error_regex=".*"):
    """Loop until an RPC to ``rank`` fails with an error matching the regex."""
    while True:
        try:
            rpc.rpc_sync(f"worker{rank}", noop, args=())
            time.sleep(0.1)
        except Exception as e:  # noqa: BLE001 - any failure of the call is what we wait for
            if re.search(pattern=expected_error_regex, string=str(e)):
                return str(e)


def initialize_pg(init_method, rank, world_size):
    # For the tests using `dist.barrier`.
    if not dist.is_initialized():
        dist.init_process_group(backend="gloo", init_method=init_method, rank=rank,
                                world_size=world_size)


def worker_name(rank):
    return f"worker{rank}"


# torch.testing's default tolerances (rtol, atol) by dtype, for assertEqual
_TOLERANCES = {"float16": (1e-3, 1e-5), "bfloat16": (1.6e-2, 1e-5), "float32": (1.3e-6, 1e-5),
               "float64": (1e-7, 1e-7), "complex64": (1.3e-6, 1e-5),
               "complex128": (1e-7, 1e-7)}


class RpcAgentTestFixture(unittest.TestCase):
    """PyTorch's ``RpcAgentTestFixture`` with ``TensorPipeRpcAgentTestFixture``'s answers."""

    rank = -1
    file_name = None

    @property
    def world_size(self):
        return 4

    @property
    def init_method(self):
        # The RPC rendezvous gets a file of its own, as with PyTorch's RPC_INIT_WITH_TCP=1
        # (its RPC on TCP, the process group on the file): distgrad's RPC file rendezvous
        # and its FileStore cannot share one file yet, which PyTorch's can.
        return self.file_init_method + ".rpc"

    @property
    def file_init_method(self):
        return "file://" + self.file_name

    @property
    def rpc_backend(self):
        return rpc.BackendType.TENSORPIPE

    @property
    def rpc_backend_options(self):
        if ON_DISTGRAD:
            return rpc.TensorPipeRpcBackendOptions(init_method=self.init_method,
                                                   allowed_modules=[CASES_MODULE])
        return rpc.TensorPipeRpcBackendOptions(init_method=self.init_method)

    def setup_fault_injection(self, faulty_messages, messages_to_delay):
        """Only the faulty agent injects faults."""

    def get_shutdown_error_regex(self):
        return "|".join(f"({e})" for e in [".*"])

    def get_timeout_error_regex(self):
        return "RPC ran for more than"

    # ------------------------------------------------------------ PyTorch's assertEqual
    def assertEqual(self, x, y, msg=None):  # noqa: N802 - unittest's name
        if isinstance(x, torch.Tensor) or isinstance(y, torch.Tensor):
            self._assert_tensors_equal(x, y, msg)
        elif isinstance(x, (list, tuple)) and isinstance(y, (list, tuple)) and \
                any(isinstance(v, torch.Tensor) for v in list(x) + list(y)):
            super().assertEqual(len(x), len(y), msg)
            for a, b in zip(x, y):
                self.assertEqual(a, b, msg)
        else:
            super().assertEqual(x, y, msg)

    def _assert_tensors_equal(self, x, y, msg):
        if not isinstance(x, torch.Tensor):
            x = torch.tensor(x, dtype=y.dtype)
        if not isinstance(y, torch.Tensor):
            y = torch.tensor(y, dtype=x.dtype)
        where = f": {msg}" if msg else ""
        if x.is_sparse != y.is_sparse:
            self.fail(f"layouts differ: {x.layout} and {y.layout}{where}")
        if x.dtype != y.dtype:
            self.fail(f"dtypes differ: {x.dtype} and {y.dtype}{where}")
        if tuple(x.shape) != tuple(y.shape):
            self.fail(f"shapes differ: {tuple(x.shape)} and {tuple(y.shape)}{where}")
        x, y = x.detach(), y.detach()
        if x.is_sparse:
            x, y = x.coalesce(), y.coalesce()
            if not torch.equal(x._indices(), y._indices()):
                self.fail(f"sparse indices differ:\n{x._indices()}\n{y._indices()}{where}")
            x, y = x._values(), y._values()
        rtol, atol = _TOLERANCES.get(str(x.dtype).split(".")[-1], (0.0, 0.0))
        if not torch.allclose(x, y, rtol=rtol, atol=atol, equal_nan=True):
            self.fail(f"tensors differ:\n{x}\n{y}{where}")

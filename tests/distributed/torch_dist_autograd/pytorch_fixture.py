"""What PyTorch's dist_autograd tests take from ``torch.testing._internal``, on public API.

``dist_autograd_cases.py`` imports these instead of PyTorch's test internals, so its
bodies run unchanged on PyTorch and on distgrad (``import torch`` is distgrad there):

* ``RpcAgentTestFixture``: PyTorch's fixture for the TensorPipe agent (4 ranks, file
  init for the process group and, in a second file, for RPC, its shutdown and timeout
  regexes) on a ``unittest.TestCase`` whose
  ``assertEqual`` compares tensors as PyTorch's ``TestCase`` does: same layout, dtype
  and shape, values within the dtype's default tolerance, sparse tensors by their
  coalesced indices and values;
* ``dist_init``, ``initialize_pg``, ``worker_name``, ``wait_until_node_failure`` (and
  ``noop``): the names the cases import, written here from what the cases ask of them;
* the skip decorators of the CUDA and macOS tests.

``runner.py`` sets ``rank`` and ``file_name`` on each test instance, as PyTorch's
``MultiProcessTestCase`` does in the process it spawns for a rank.
"""
import re
import sys
import time
import unittest
from functools import wraps

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


def worker_name(rank):
    """The RPC name of ``rank`` (the cases build peers' names with it)."""
    return "worker" + str(rank)


def dist_init(test=None, *, clean_shutdown=True):
    """Run a test method inside an RPC world that its ranks join for it alone.

    The cases write ``@dist_init`` or ``@dist_init(clean_shutdown=False)``. The rank
    joins as ``worker<rank>`` with the fixture's backend and options, runs the body, and
    leaves with ``rpc.shutdown(graceful=clean_shutdown)``; a body that raises leaves the
    world as it is (the runner then starts a new one). The method keeps
    ``clean_shutdown`` as an attribute: ``runner.py`` reads it to know that a world left
    ungracefully cannot serve the next test. ``init_rpc`` is called from this module,
    which makes its functions (``noop``) callable by peers on distgrad.
    """
    def decorate(body):
        @wraps(body)
        def run_in_world(self, *args, **kwargs):
            self.worker_id = self.rank  # the cases compare context ids' high bits with it
            rpc.init_rpc(name=worker_name(self.rank), backend=self.rpc_backend,
                         rank=self.rank, world_size=self.world_size,
                         rpc_backend_options=self.rpc_backend_options)
            result = body(self, *args, **kwargs)
            rpc.shutdown(graceful=clean_shutdown)
            return result

        run_in_world.clean_shutdown = clean_shutdown
        return run_in_world

    return decorate if test is None else decorate(test)


def noop():
    """Does nothing: called remotely to find out whether a peer still answers."""


_PROBE_INTERVAL = 0.1  # seconds between two calls to a peer that still answers


def wait_until_node_failure(rank, expected_error_regex=".*"):
    """Block until ``rank`` is gone: call ``noop`` on it again and again until a call
    fails with an error whose text matches ``expected_error_regex``; return that text.
    (The cases stop some ranks on purpose and wait here before they check what a
    backward pass through the dead ranks raises.)"""
    expected = re.compile(expected_error_regex)
    while True:
        try:
            rpc.rpc_sync(worker_name(rank), noop)
        except Exception as error:  # noqa: BLE001 - a failing call is what we wait for
            if expected.search(str(error)):
                return str(error)
        time.sleep(_PROBE_INTERVAL)


def initialize_pg(init_method, rank, world_size):
    """Join the default (gloo) process group for the cases that call ``dist.barrier``;
    a rank that has joined already (an earlier case in this world) stays in it."""
    if dist.is_initialized():
        return
    dist.init_process_group(backend="gloo", init_method=init_method, rank=rank,
                            world_size=world_size)


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

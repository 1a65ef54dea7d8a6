"""Leaving a distributed autograd context does not wait for the workers to release it
(as PyTorch): tests that check the releases poll for them, within a bound."""
import time

from distgrad.distributed import autograd as dist_autograd
from distgrad.distributed import rpc


def live_everywhere(timeout=5.0):
    """``debug_live_contexts()`` once no process holds a context, or at the deadline."""
    deadline = time.monotonic() + timeout
    while True:
        live = dist_autograd.debug_live_contexts()
        if not any(live.values()) or time.monotonic() > deadline:
            return live
        time.sleep(0.01)


def live_on(worker, timeout=5.0):
    """The context ids ``worker`` holds, once it holds none, or at the deadline."""
    deadline = time.monotonic() + timeout
    while True:
        live = rpc.rpc_sync(worker, dist_autograd._engine.live_contexts)
        if not live or time.monotonic() > deadline:
            return live
        time.sleep(0.01)

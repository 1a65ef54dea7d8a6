"""Functions the profiler's RPC tests run on workers."""
import distgrad
from distgrad.autograd import profiling


def work(n):
    """A few ops: ones, matmul, sum."""
    x = distgrad.ones(n, n)
    return (x @ x).sum()


def peer_sessions():
    """How many profile sessions of peers this worker still holds."""
    return len(profiling.peer_sessions())

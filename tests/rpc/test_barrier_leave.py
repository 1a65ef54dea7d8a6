"""A rank waiting at rank 0's shutdown barrier when rank 0's LEAVE arrives: rank 0's reply
to the barrier and its LEAVE travel on different connections, so the LEAVE can come
first. A LEAVE that says the barrier was met ends the wait as its reply would have; any
other departure of rank 0 fails it (seen under load in CI: both ways of forming a world
on one master port, and a case of PyTorch's distributed autograd tests)."""
import time

import pytest

from distgrad.futures import Future
from distgrad.rpc.barrier import MET
from distgrad.rpc.errors import WorkerUnreachableError
from distgrad.rpc.lifecycle import Lifecycle

pytestmark = pytest.mark.timeout(30)


class _GoneTransport:
    """Rank 0 left, saying ``why``."""

    def __init__(self, why):
        self.why = why

    def left(self, rank):
        return rank == 0

    def down(self, rank):
        return self.why if rank == 0 else None


class _CallerOfALeftRank:
    def call(self, *args, **kwargs):
        fut = Future()
        fut.set_exception(WorkerUnreachableError("worker 'w0' (rank 0) left the world"))
        return fut


def _arrive(why):
    lifecycle = Lifecycle.__new__(Lifecycle)  # only the parts the barrier wait uses
    lifecycle.transport, lifecycle.caller = _GoneTransport(why), _CallerOfALeftRank()
    return lifecycle._arrive_at_barrier(time.monotonic() + 5)


def test_a_leave_saying_the_barrier_was_met_ends_the_wait():
    assert _arrive(MET) is None


def test_any_other_leave_of_rank_0_fails_the_wait():
    with pytest.raises(WorkerUnreachableError):
        _arrive("it shut down")

"""PeerLiveness on its own (``liveness.py``), without sockets or processes: its deadlines
(which the transport's poll waits for) and what it reports when they pass. The events
of real connections are test_liveness.py's."""
import time
import types

import pytest
import zmq

from distgrad.rpc.liveness import PeerLiveness

pytestmark = pytest.mark.timeout(30)

OPTIONS = types.SimpleNamespace(heartbeat_interval=0.2, heartbeat_timeout=1.0)


class _Handlers:
    def __init__(self):
        self.reports = []

    def on_peer_down(self, rank, why, left):
        self.reports.append(("down", rank, why, left))

    def on_peer_up(self, rank):
        self.reports.append(("up", rank))


@pytest.fixture
def watched():
    """A PeerLiveness of rank 0 watching unconnected dealers to itself and to rank 1."""
    ctx = zmq.Context()
    handlers = _Handlers()
    liveness = PeerLiveness(0, OPTIONS, handlers)
    dealers = [ctx.socket(zmq.DEALER) for _ in range(2)]
    try:
        for rank, d in enumerate(dealers):
            liveness.watch(d, rank)
        yield liveness, handlers
    finally:
        for s in [*liveness.monitors, *dealers]:
            s.close(linger=0)
        ctx.term()


def test_a_peer_is_on_probation_until_its_handshake_and_reported_dead_after_the_timeout(
        watched):
    liveness, handlers = watched
    before = time.monotonic()
    deadline = liveness.next_deadline(before + 60)
    assert before < deadline <= time.monotonic() + OPTIONS.heartbeat_timeout
    assert liveness.next_deadline(before) == before  # an earlier deadline is kept
    liveness.expire(deadline - 0.001)
    assert handlers.reports == [] and liveness.down(1) is None
    liveness.expire(deadline)
    never = "no connection completed within 1.0 s of the first attempt"
    assert handlers.reports == [("down", 1, never, False)]
    assert liveness.down(1) == never and not liveness.left(1)
    assert liveness.down(0) is None  # its own dealer is never on probation
    assert liveness.next_deadline(before + 60) == before + 60  # nothing left to wait for


def test_a_peer_that_leaves_is_down_at_once_and_reported_a_grace_later(watched):
    liveness, handlers = watched
    liveness.on_leave(1, "it is done")
    assert liveness.down(1) == "it is done" and liveness.left(1)
    later = time.monotonic() + 60
    due = liveness.next_deadline(later)
    assert due < later  # the grace is one of the poll's deadlines; the probation is over
    liveness.expire(due - 0.001)
    assert handlers.reports == []
    liveness.expire(due)
    assert handlers.reports == [("down", 1, "it is done", True)]
    liveness.expire(later)
    assert handlers.reports == [("down", 1, "it is done", True)]  # reported once

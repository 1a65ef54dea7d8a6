"""A stage waiting for its neighbour's message: what it was sent before the neighbour went
is still taken; once the RPC layer reports the neighbour gone, the wait ends at once with
an error naming it (a host lost with the message in flight used to leave its neighbour
waiting out the RPC timeout, the coordinator's calls to the lost host all answered)."""
import threading
import time
from types import SimpleNamespace

import pytest

from distgrad.launch import stage as stage_module
from distgrad.launch.stage import Inbox

pytestmark = pytest.mark.timeout(60)


def test_a_message_that_came_first_is_taken_then_the_wait_for_the_next_fails_at_once():
    inbox = Inbox()
    inbox.put((1, "grad", 0, 0), "g")
    inbox.sender_gone("worker2", "no heartbeat for 2.0 s")
    assert inbox.take((1, "grad", 0, 0), 30, "worker2") == "g"
    t0 = time.monotonic()
    with pytest.raises(RuntimeError, match=r"worker2 is unreachable while this stage waits "
                                           r"for its message \(1, 'grad', 0, 1\).*no heartbeat"):
        inbox.take((1, "grad", 0, 1), 30, "worker2")
    assert time.monotonic() - t0 < 1.0


def test_a_waiting_take_wakes_when_its_sender_is_gone_but_not_for_another_sender():
    inbox = Inbox()
    errors = []

    def wait():
        try:
            inbox.take((2, "act", 1, 0), 30, "worker1")
        except RuntimeError as e:
            errors.append(e)
    waiter = threading.Thread(target=wait)
    waiter.start()
    inbox.sender_gone("worker3", "gone")   # somebody else: the wait goes on
    waiter.join(0.2)
    assert waiter.is_alive()
    inbox.sender_gone("worker1", "its process is gone (connection refused)")
    waiter.join(10)
    assert not waiter.is_alive() and "worker1 is unreachable" in str(errors[0])


def test_the_rpc_agent_tells_the_stage_of_a_neighbour_killed_while_it_waits(rpc_world,
                                                                           monkeypatch):
    world = rpc_world(2)
    inbox = Inbox()
    monkeypatch.setattr(stage_module, "_stage", SimpleNamespace(inbox=inbox))
    stage_module.watch_neighbours()
    stage_module.watch_neighbours()  # once per agent, however often a stage is set up
    world.kill("worker1")
    with pytest.raises(RuntimeError, match="worker1 is unreachable while this stage waits"):
        inbox.take((1, "grad", 0, 0), 30, "worker1")

"""Per-peer quotas: what one peer can make another hold is bounded per peer, a peer at
its bound gets a clear error, and the others go on being served."""
import time

import pytest

from distgrad.distributed import rpc
from distgrad.rpc import wire
from distgrad.rpc.errors import BackpressureError, RpcError
from distgrad.rpc.owner import OwnerTable
from distgrad.rpc.quota import PeerGate
from support import forger
from support import rpc_funcs as f

pytestmark = pytest.mark.timeout(120)


def test_each_peers_requests_decode_within_its_own_bounds():
    g = PeerGate(3, slots=2, decoding_bytes=100, waiting_requests=3, waiting_bytes=1000)
    assert g.admit(1, 10, "a") and g.admit(1, 10, "b")
    assert g.admit(1, 10, "c") is False                 # two decode already: it waits
    assert g.admit(1, 10, "d") is False and g.admit(1, 10, "e") is False
    with pytest.raises(BackpressureError, match=r"rank 1 has 3 requests .* waiting"):
        g.admit(1, 10, "f")
    assert g.admit(2, 500, "x")                         # another peer: a gate of its own
    assert g.load(1) == (2, 3, 2) and g.load(2) == (1, 0, 1)  # (one is admitted, any size)
    assert g.decoded(1, 10) == ["c"] and g.decoded(1, 10) == ["d"]
    assert g.decoded(1, 10) == ["e"] and g.load(1) == (2, 0, 5)
    # bytes: decoding ones hold at most 100 bytes of bodies, waiting ones at most 1000
    assert g.admit(0, 80, "big") and g.admit(0, 30, "next") is False
    with pytest.raises(BackpressureError, match="bytes"):
        g.admit(0, 990, "huge")
    assert g.decoded(0, 80) == ["next"]


def test_a_peer_holds_its_share_of_handler_threads_and_past_it_only_when_stalled():
    g = PeerGate(2, slots=8, serving=3)
    assert all(g.admit(1, 1, job) for job in "abc") and g.decoded(1, 1) == []
    assert g.admit(1, 1, "d") is False  # two still decode, one runs: all hold a thread
    assert g.admit(0, 1, "x")           # the other peer is not locked out
    assert g.finished(1) == ["d"] and g.load(1) == (3, 0, 3)
    # waiting ones (a burst) do not hold threads; they start as threads come free
    g = PeerGate(2, slots=1, serving=2)
    assert g.admit(1, 1, "a") and g.admit(1, 1, "b") is False and g.admit(1, 1, "c") is False
    assert g.decoded(1, 1) == ["b"]          # a runs, b decodes: two threads
    assert g.decoded(1, 1) == []             # c waits for a thread, not for a slot
    assert g.finished(1) == ["c"] and g.load(1) == (1, 0, 2)
    assert PeerGate(4).serving == 256 and PeerGate(1000).serving == 16


def test_a_stalled_share_grows_to_twice_itself_then_refuses_with_why():
    g = PeerGate(2, slots=8, serving=2)
    assert g.admit(1, 1, "a") and g.admit(1, 1, "b")
    assert [g.admit(1, 1, job) for job in "cdef"] == [False] * 4
    now = time.monotonic()
    assert g.stalled(now) == ([], [])                     # not for long yet
    assert g.next_check <= now + g.stalled_after
    ready, refused = g.stalled(now + g.stalled_after)      # none finished: past the share
    assert ready == ["c", "d"] and refused == [] and g.load(1) == (4, 2, 4)
    with pytest.raises(BackpressureError, match=r"rank 1 has 4 requests being served here, "
                                                r"twice its share .* refused"):
        g.admit(1, 1, "g")                                 # twice the share is the bound
    assert g.admit(0, 1, "x")                              # the others are not locked out
    ready, refused = g.stalled(now + 2 * g.stalled_after)  # and stalled at twice it
    assert ready == [] and [job for job, _ in refused] == ["e", "f"]
    assert "none of them finished" in str(refused[0][1]) and g.load(1) == (4, 0, 4)
    for _ in range(3):
        g.finished(1)
    assert g.admit(1, 1, "h") and g.load(1)[1:] == (0, 2)  # back within its share


def test_a_peer_whose_handlers_wait_for_its_own_later_requests_is_served(rpc_world):
    rpc_world(2)
    assert rpc.rpc_sync("worker1", forger.set_share, (8,)) >= 16
    rpc.rpc_sync("worker1", f.close_gate)
    # twice the share: 15 handlers that wait for the gate, then the call that opens it
    t0 = time.monotonic()
    waits = [rpc.rpc_async("worker1", f.wait_for_gate, (60,)) for _ in range(15)]
    opener = rpc.rpc_async("worker1", f.open_gate)
    assert [w.wait(30) for w in waits] == [True] * 15 and opener.wait(30) is None
    assert time.monotonic() - t0 < 30   # not the handlers' own 60 s
    # past twice the share: the call that would open the gate is refused at once, saying
    # why; the others' calls are still served (worker2 opens it)
    rpc.rpc_sync("worker1", f.close_gate)
    waits = [rpc.rpc_async("worker1", f.wait_for_gate, (60,)) for _ in range(16)]
    opener = rpc.rpc_async("worker1", f.open_gate)
    with pytest.raises(BackpressureError, match="twice its share of handler threads"):
        opener.wait(30)
    assert rpc.rpc_sync("worker2", f.nested_call, ("worker1", f.open_gate)) is None
    assert [w.wait(30) for w in waits] == [True] * 16
    assert time.monotonic() - t0 < 60


def test_a_peer_cannot_fill_the_rref_table_for_the_others():
    table = OwnerTable(3, max_pending_per_peer=5)
    for i in range(5):
        table.add_fork((1, i), (1, i), 1, src=1)
    with pytest.raises(RpcError, match="rank 1 already made 5 RRef entries here that have no "
                                       "value yet"):
        table.add_fork((1, 99), (1, 99), 1, src=1)
    table.add_fork((2, 0), (2, 0), 1, src=2)             # the others are not locked out
    table.set_value((1, 0), "value")                     # a value settles an entry
    table.add_fork((1, 100), (1, 100), 1, src=1)
    table.forget_peer(1)                                 # and a peer's death all of them
    for i in range(5):
        table.add_fork((1, 200 + i), (1, 200 + i), 1, src=1)


def test_a_flooding_member_holds_few_threads_and_the_others_are_served(rpc_world):
    rpc_world(2)
    _, peak_before = rpc.rpc_sync("worker1", f"{forger.__name__}:handler_threads")
    answers = rpc.rpc_sync("worker2", f"{forger.__name__}:flood", (1, [b"\x93\xc1"] * 1000),
                           timeout=90)
    assert len(answers) == 1000 and {kind for kind, _ in answers} == {wire.Kind.ERROR}
    _, peak = rpc.rpc_sync("worker1", f"{forger.__name__}:handler_threads")
    # decoding is bounded per peer (4 at once): the flood does not start a thread per
    # message (at most the slots decoding, and as many finishing their error replies)
    assert peak <= peak_before + 2 * 4, (peak_before, peak)
    flood = rpc.rpc_async("worker2", f"{forger.__name__}:flood", (1, [b"\x93\xc1"] * 1000),
                          timeout=90)
    # the others are served meanwhile
    assert [rpc.rpc_sync("worker1", f.add, (i, 1)) for i in range(50)][-1] == 50
    assert len(flood.wait(90)) == 1000

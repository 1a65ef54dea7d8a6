"""How many times a request changes threads, per path (PROTOCOL.md's table), counted.

Every place where the RPC layer hands work to another thread counts one hand-off in
``agent.stats["handoffs"]``: a request handed to a handler thread, a Future completed
on the I/O thread while a thread waits for it, callbacks handed to the pool. Sending
never hands off: a message leaves from the thread that produced it.
"""
import threading

import pytest

from distgrad.distributed import rpc
from distgrad.rpc import current_agent, wire
from support import rpc_funcs as f

pytestmark = pytest.mark.timeout(60)

N = 20


def _handoffs_here():
    return current_agent().stats["handoffs"]


def _handoffs_on(worker):
    # the snapshot call is itself a request served on a handler: counted before it reads
    return rpc.rpc_sync(worker, f.agent_stats)["handoffs"]


@pytest.fixture(params=["ipc", "tcp"])
def world(request, rpc_world):
    return rpc_world(1, transport=request.param)


def test_rpc_sync_costs_one_handoff_on_each_side(world):
    there = _handoffs_on("worker1")
    here = _handoffs_here()  # after: that call woke this thread too
    for i in range(N):
        assert rpc.rpc_sync("worker1", f.add, (i, 1)) == i + 1
    # there: N requests handed to a handler, plus the second snapshot; here: at most the
    # N waits woken plus the snapshot's (a reply that beats its caller to the wait wakes
    # nobody)
    assert _handoffs_on("worker1") - there == N + 1
    assert _handoffs_here() - here <= N + 1


def test_rpc_async_then_wait_costs_the_same(world):
    there = _handoffs_on("worker1")
    here = _handoffs_here()  # after: that call woke this thread too
    futs = [rpc.rpc_async("worker1", f.add, (i, 1)) for i in range(N)]
    assert [fut.wait() for fut in futs] == [i + 1 for i in range(N)]
    assert _handoffs_on("worker1") - there == N + 1
    # a Future completed before anyone waits for it wakes nobody: at most one per call
    assert _handoffs_here() - here <= N + 1


def test_system_calls_are_served_on_the_io_thread(world):
    counter = rpc.remote("worker1", f.Counter, args=(5,))
    assert counter.rpc_sync().increment(0) == 5  # created and ready
    value = rpc.remote("worker1", f.add, (2, 3))
    assert value.to_here() == 5
    there = _handoffs_on("worker1")
    here = _handoffs_here()  # after: that call woke this thread too
    for _ in range(N):
        assert value.to_here() == 5  # @rref.fetch: a SYSTEM message
    assert _handoffs_on("worker1") - there == 1  # the snapshot only: fetches never left I/O
    # here a reply can even beat the caller to its wait (then nobody is woken)
    assert _handoffs_here() - here <= N + 1


def test_requests_and_replies_leave_from_the_thread_that_made_them(world):
    transport = current_agent().transport
    senders = []
    original = transport.send

    def send(dst, frames):
        # this test's calls only: the world is shared, and other traffic may leave from
        # other threads meanwhile (a notice that waited for a ride in vain leaves from the
        # I/O thread; a call or reply of what an earlier test left running)
        if wire.unpack_header(bytes(frames[0]))[0] == wire.Kind.CALL \
                and b"rpc_funcs:add" in bytes(frames[1]):
            senders.append(threading.get_ident())
        return original(dst, frames)
    transport.send = send
    try:
        rpc.rpc_sync("worker1", f.add, (1, 2))
        rpc.rpc_async("worker1", f.add, (1, 2)).wait()
        results = []
        t = threading.Thread(target=lambda: results.append(rpc.rpc_sync("worker1", f.add,
                                                                         (3, 4))))
        t.start()
        t.join(30)
    finally:
        transport.send = original
    assert results == [7]
    assert senders == [threading.get_ident()] * 2 + [t.ident]
    assert not transport._outbox  # nothing was handed to the I/O thread to send


def test_a_reply_leaves_from_the_handler_that_produced_it(world):
    # the worker records the thread that ran the first call and the one that sent its reply
    assert rpc.rpc_sync("worker1", f.reply_thread_probe_start)
    ran, sent = rpc.rpc_sync("worker1", f.reply_thread_probe_result)
    assert ran is not None and ran == sent


def test_a_never_blocks_function_is_served_where_it_arrives(world):
    # the first call resolves the reference on a handler: its module is not imported there
    # yet (the I/O thread never imports)
    assert rpc.rpc_sync("worker1", f.thread_on_arrival) != "rpc-io-worker1"
    there = _handoffs_on("worker1")
    names = {rpc.rpc_sync("worker1", f.thread_on_arrival) for _ in range(N)}
    assert names == {"rpc-io-worker1"}
    assert _handoffs_on("worker1") - there == 1  # the snapshot only
    with pytest.raises(ValueError, match="boom"):
        rpc.rpc_sync("worker1", f.fail_on_arrival, ("boom",))
    with pytest.raises(ValueError, match="boom"):  # resolved now: raised on the I/O thread
        rpc.rpc_sync("worker1", f.fail_on_arrival, ("boom",))
    assert rpc.rpc_sync("worker1", f.thread_on_arrival) == "rpc-io-worker1"  # still serving


def test_a_never_blocks_function_of_an_imported_module_is_served_where_it_arrives_at_once(world):
    assert rpc.rpc_sync("worker1", f.add, (1, 2)) == 3  # imports its module there (a handler)
    there = _handoffs_on("worker1")
    assert rpc.rpc_sync("worker1", f.thread_on_arrival) == "rpc-io-worker1"
    assert _handoffs_on("worker1") - there == 1  # the snapshot only
    with pytest.raises(ValueError, match="boom"):  # a first call that raises, raised there
        rpc.rpc_sync("worker1", f.fail_on_arrival, ("boom",))
    assert rpc.rpc_sync("worker1", f.thread_name) != "rpc-io-worker1"  # unmarked: never


def test_a_large_call_of_a_never_blocks_function_goes_to_a_handler(world):
    from distgrad.rpc.dispatch import ON_ARRIVAL_MAX_BODY
    rpc.rpc_sync("worker1", f.thread_on_arrival)
    big = "x" * (ON_ARRIVAL_MAX_BODY + 1)  # a string rides in the body
    assert rpc.rpc_sync("worker1", f.thread_on_arrival, (big,)) != "rpc-io-worker1"
    assert rpc.rpc_sync("worker1", f.thread_on_arrival, ("small",)) == "rpc-io-worker1"


def test_an_unmarked_function_is_never_served_on_the_io_thread(world):
    for _ in range(3):
        assert rpc.rpc_sync("worker1", f.thread_name) != "rpc-io-worker1"


def test_while_faults_may_hold_replies_a_never_blocks_function_goes_to_a_handler(world):
    # an injected delay sleeps in the sending thread: never the I/O thread
    assert rpc.rpc_sync("worker1", f.thread_on_arrival) is not None  # resolved there
    rule = world.faults.delay(0.0, fn=f.thread_on_arrival, src="worker1", kind="response")
    try:
        assert rpc.rpc_sync("worker1", f.thread_on_arrival) != "rpc-io-worker1"
    finally:
        rule.remove()
    assert rpc.rpc_sync("worker1", f.thread_on_arrival) == "rpc-io-worker1"


def test_a_thread_past_its_share_of_sockets_relays_through_the_io_thread(rpc_world,
                                                                        monkeypatch):
    from distgrad.rpc import own_sockets
    rpc_world(3)
    monkeypatch.setattr(own_sockets, "OWN_SOCKETS_PER_THREAD", 1)
    relayed = current_agent().stats["relayed"]

    def calls(out):
        out.extend(rpc.rpc_sync(f"worker{w}", f.add, (w, i)) for i in range(5)
                   for w in (1, 2, 3))
        out.append(len(current_agent().transport.own_sockets.mine()))
    out = []
    t = threading.Thread(target=calls, args=(out,))
    t.start()
    t.join(30)
    assert out[:-1] == [w + i for i in range(5) for w in (1, 2, 3)]
    assert out[-1] == 1  # one socket of its own; the calls to the other two peers relayed
    assert current_agent().stats["relayed"] - relayed == 10


def test_steps_of_distributed_autograd_wake_no_io_thread(world):
    # A step's context is released on the workers by notices that ride along on the next
    # step's messages; a notice or a call's timeout is a deadline the I/O thread looks at
    # before it polls (every 10 ms at most while messages flow), so none of them needs a
    # wake-up of its own (Transport.wake_by).
    import distgrad
    import distgrad.distributed.autograd as dist_autograd

    x = distgrad.ones(4, requires_grad=True)

    def steps(n):
        for _ in range(n):
            with dist_autograd.context() as cid:
                y = rpc.rpc_sync("worker1", f.add, (x, 1.0)).sum()
                dist_autograd.backward(cid, [y])

    steps(3)
    there = rpc.rpc_sync("worker1", f.agent_stats).get("wakes", 0)
    here = current_agent().stats["wakes"]
    steps(N)
    woken_there = rpc.rpc_sync("worker1", f.agent_stats).get("wakes", 0) - there
    woken_here = current_agent().stats["wakes"] - here
    # (every step woke the coordinator's I/O thread before; a step whose end found that
    # thread in a long poll, which a loaded machine makes now and then, still does)
    assert woken_there < N // 2 and woken_here < N // 2, (woken_here, woken_there)

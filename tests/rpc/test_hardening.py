"""The RPC layer as an attacker and a heavy user see it: floods, hostile frames, forged
internal operations, clashing rendezvous; the answer is a clear error and nothing lost."""
import random
import threading
import time

import msgpack
import pytest
import zmq

from distgrad.distributed import rpc
from distgrad.rpc import ProtocolError, current_agent, wire
from distgrad.rpc.rendezvous import RendezvousError, RendezvousServer, join
from support import rpc_funcs as f

pytestmark = pytest.mark.timeout(90)


def _raw(rank=1):
    """A socket that speaks the protocol by hand to ``rank``, as this process (rank 0): it
    presents this process's credential."""
    transport = current_agent().transport
    ctx = zmq.Context()
    s = ctx.socket(zmq.DEALER)
    s.linger = 0
    s.sndtimeo = 5000  # a test must fail, not hang, if the worker went away
    for option, value in transport.client_options(rank).items():
        setattr(s, option, value)
    s.connect(transport.endpoints[rank])
    return ctx, s


def _call(target, args, kwargs=None, remote=None):
    return msgpack.packb([target, args, kwargs or {}, remote])


def _reply(s, timeout=5.0):
    assert s.poll(int(timeout * 1000)), "no reply"
    frames = s.recv_multipart()
    kind, mid, _, _, _ = wire.unpack_header(frames[0])
    return kind, mid, frames[1:]


# ---------------------------------------------------------------------- load
def test_backpressure_bounds_calls_in_flight_and_can_raise(rpc_world):
    rpc_world(2, max_inflight_per_worker=8)
    agent = current_agent()
    rpc.rpc_sync("worker1", f.close_gate)
    seen, stop = [], threading.Event()

    def watch():
        while not stop.is_set():
            seen.append(agent.calls.inflight(1))
            time.sleep(0.001)

    def flood(out):
        out.extend(rpc.rpc_async("worker1", f.wait_for_gate, (10,)) for _ in range(10))
    futs, watcher = [], threading.Thread(target=watch)
    watcher.start()
    flooders = [threading.Thread(target=flood, args=(futs,)) for _ in range(4)]
    for t in flooders:
        t.start()
    time.sleep(0.5)
    assert sum(t.is_alive() for t in flooders) >= 3  # blocked: 8 slots, 40 calls
    # every slot to worker1 is taken: worker2 opens the gate for us
    rpc.rpc_sync("worker2", f.nested_call, ("worker1", f.open_gate))
    for t in flooders:
        t.join(20)
    assert all(fut.wait(20) is True for fut in futs) and len(futs) == 40
    stop.set()
    watcher.join()
    assert max(seen) <= 8
    agent.options.backpressure = "raise"
    rpc.rpc_sync("worker1", f.close_gate)
    held = [rpc.rpc_async("worker1", f.wait_for_gate, (10,)) for _ in range(8)]
    with pytest.raises(rpc.BackpressureError, match="8 calls"):
        rpc.rpc_async("worker1", f.add, (1, 2))
    agent.options.backpressure = "block"
    rpc.rpc_sync("worker2", f.nested_call, ("worker1", f.open_gate))
    assert all(h.wait(10) for h in held)


def test_shutdown_finishes_earlier_calls_and_a_thread_calling_without_end_cannot_hold_it(
        rpc_world):
    """Other threads may call while the main thread shuts down (as on PyTorch:
    test_shutdown_vs_torch.py), but the shutdown waits only for the calls made before it: one
    that calls back to back ends it anyway, and its first call after it fails."""
    rpc_world(1)
    earlier = [rpc.rpc_async("worker1", f.sleep_and_return, (0.5, i)) for i in range(5)]
    calling, answered, failed = threading.Event(), [], []

    def flood():
        while True:
            try:
                answered.append(rpc.rpc_sync("worker1", f.add, (1, 2)))
            except Exception as e:  # noqa: BLE001 - what a program sees once RPC is shut down
                failed.append(e)
                return
            calling.set()
    t = threading.Thread(target=flood)
    t.start()
    assert calling.wait(30)
    rpc.shutdown()
    t.join(10)
    assert not t.is_alive()
    assert [fut.value() for fut in earlier] == list(range(5))
    assert answered and set(answered) == {3}
    assert failed and ("shut" in str(failed[0]) or "not been initialized" in str(failed[0])), \
        failed


def test_no_lost_wakeup_after_bursts_of_async_calls(rpc_world):
    rpc_world(1)
    for _ in range(5):
        futs = []
        threads = [threading.Thread(target=lambda: futs.extend(
            rpc.rpc_async("worker1", f.add, (i, 1)) for i in range(300))) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        assert sum(fut.wait(30) for fut in futs) == 4 * sum(range(1, 301))
        t0 = time.monotonic()
        for i in range(100):  # sequential: each waits for its wake-up
            assert rpc.rpc_async("worker1", f.add, (i, 1)).wait(5) == i + 1
        assert (time.monotonic() - t0) / 100 < 0.05  # a lost wake-up costs ~1 s each


# ---------------------------------------------------------------------- hostile input
def test_every_call_with_a_readable_header_gets_a_reply(rpc_world):
    rpc_world(1)
    ctx, s = _raw(1)
    bodies = [
        b"\x93\xc1", b"", msgpack.packb(None), msgpack.packb([1, 2, 3, 4]),
        _call("support.rpc_funcs:add", [1, 2], remote=[[1], [2]]),           # unhashable ids
        _call("support.rpc_funcs:add", [1, 2], remote=[[1, 2], [0, "x"]]),
        _call("support.rpc_funcs:add", {"a": 1}),
        _call("@rref.fetch", [[0, 999999]], {"bogus": 1}),
        _call("@nope", []), _call("@barrier", []), _call("@shm.probe", [1, "../x", "t", 4]),
        _call("os:system", ["true"]), _call(["a"], []),
        msgpack.packb(["support.rpc_funcs:add", [1, 2], {1: 2}, None]),
    ]
    extras = [None, {"autograd": [1]}, {"autograd": [[1], 2, 3]}, [1, 2], {"x": {"y": [None]}}]
    try:
        for i, body in enumerate(bodies):
            extra = extras[i % len(extras)]
            s.send_multipart([wire.pack_header(wire.Kind.CALL, 100 + i, 0, extra), body])
            kind, mid, _ = _reply(s)
            assert (kind, mid) == (wire.Kind.ERROR, 100 + i), body
        s.send_multipart([wire.pack_header(wire.Kind.CALL, 7, 0),
                          _call("support.rpc_funcs:add", [1, 2])])
        assert _reply(s)[:2] == (wire.Kind.REPLY, 7)
        s.send_multipart([wire.pack_header(wire.Kind.CALL, 8, 0),  # a path as segment name
                          _call("@shm.probe", [1, "../../etc/passwd", "root"])])
        kind, _, frames = _reply(s)
        assert kind == wire.Kind.REPLY and msgpack.unpackb(frames[0]) is False
    finally:
        ctx.destroy(linger=0)
    assert rpc.rpc_sync("worker1", f.add, (2, 2)) == 4


def test_installers_a_header_asks_for_are_checked_like_calls(rpc_world):
    """``@install`` names entry points the receiver runs before reading a call: malformed
    lists and references the allowlist refuses are refused as a call of them would be; the
    call itself is not served; the worker serves on."""
    rpc_world(1)
    ctx, s = _raw(1)
    body = _call("support.rpc_funcs:add", [1, 2])
    cases = [(5, "malformed"), (["x"] * 9, "malformed"), ([1], "malformed"),
             (["os:system"], "refused"), (["support.rpc_funcs:nope"], "")]
    try:
        for i, (refs, why) in enumerate(cases):
            s.send_multipart([wire.pack_header(wire.Kind.CALL, 200 + i, 0, {"@install": refs}),
                              body])
            kind, mid, frames = _reply(s)
            assert (kind, mid) == (wire.Kind.ERROR, 200 + i), refs
            assert why in msgpack.unpackb(frames[0])[2], refs
            # a SYSTEM message too (it goes to a handler while its installer has not run)
            s.send_multipart([wire.pack_header(wire.Kind.SYSTEM, 300 + i, 0,
                                               {"@install": refs}), _call("@barrier", [])])
            assert _reply(s)[:2] == (wire.Kind.ERROR, 300 + i), refs
        # one the allowlist allows runs once, then the call is served
        refs = ["support.rpc_funcs:count_installs"]
        for mid in (400, 401):
            s.send_multipart([wire.pack_header(wire.Kind.CALL, mid, 0, {"@install": refs}),
                              _call("support.rpc_funcs:installs", [])])
            kind, _, frames = _reply(s)
            assert kind == wire.Kind.REPLY and msgpack.unpackb(frames[0]) == 1
    finally:
        ctx.destroy(linger=0)
    assert rpc.rpc_sync("worker1", f.add, (2, 2)) == 4


def _is_leave(header):
    try:
        return wire.unpack_header(header)[0] == wire.Kind.LEAVE
    except ProtocolError:
        return False


def test_fuzzing_a_live_worker_with_ten_thousand_frames(rpc_world):
    world = rpc_world(1)
    ctx, s = _raw(1)
    rng = random.Random(1234)
    good = [wire.pack_header(wire.Kind.CALL, 1, 0), _call("support.rpc_funcs:add", [1, 2])]

    def mutate(b):
        b = bytearray(b)
        for _ in range(rng.randint(1, 4)):
            op = rng.random()
            if op < 0.4 and b:
                b[rng.randrange(len(b))] = rng.randrange(256)
            elif op < 0.7:
                b.insert(rng.randrange(len(b) + 1), rng.randrange(256))
            elif b:
                del b[rng.randrange(len(b))]
        return bytes(b)
    try:
        for i in range(10_000):
            r = rng.random()
            if r < 0.5:
                frames = [mutate(good[0]), mutate(good[1])]
            elif r < 0.8:
                frames = [good[0], mutate(good[1])]
            else:
                frames = [rng.randbytes(rng.randint(0, 64)) for _ in range(rng.randint(1, 4))]
            if _is_leave(frames[0]):
                # not garbage: this process (rank 0, by its credential) saying it leaves
                # the world, which the worker rightly acts on (frame 3879 of this seed)
                continue
            s.send_multipart(frames)
            while s.poll(0):
                s.recv_multipart()
    finally:
        ctx.destroy(linger=0)
    assert rpc.rpc_sync("worker1", f.add, (20, 22)) == 42
    assert world.procs["worker1"].poll() is None


@pytest.mark.no_leak_check  # the forged fetches leave waiting entries that only expire
def test_forged_internal_operations_are_validated_and_bounded(rpc_world):
    rpc_world(1)
    ctx, s = _raw(1)
    try:
        # a fork id may only be registered by its creator: a notice in which rank 0 claims
        # rank 1's fork is refused (counted; notices get no answer) and creates no entry
        errors = rpc.rpc_sync("worker1", f.agent_stats).get("handler_errors", 0)
        s.send_multipart([wire.pack_header(wire.Kind.SYSTEM, 0, 0,
                                           {"@bk": [["rref.add", [[[0, 5], [1, 5]]]]]}),
                          _call("@bk", [])])
        deadline = time.monotonic() + 10
        while rpc.rpc_sync("worker1", f.agent_stats).get("handler_errors", 0) == errors:
            assert time.monotonic() < deadline, "the forged fork registration was not refused"
            time.sleep(0.02)
        assert rpc.rpc_sync("worker1", f.rref_count) == 0
        # 300 fetches of values that will never exist hold no handler thread
        for i in range(300):
            s.send_multipart([wire.pack_header(wire.Kind.CALL, 10 + i, 0),
                              _call("@rref.fetch", [[0, 10_000 + i]])])
        # a call after them on the same connection: once it is answered, every fetch was
        # handed to the pool (one connection's messages are taken in order)
        s.send_multipart([wire.pack_header(wire.Kind.CALL, 9999, 0),
                          _call("support.rpc_funcs:add", [1, 2])])
        while _reply(s, timeout=30)[1] != 9999:   # (fetches over the limit are refused)
            pass
        # parked, they would hold threads for the RPC timeout (60 s); served, the pool goes
        # idle as soon as it got through them (busy counts jobs queued or running; the
        # thread of the previous poll may not have counted itself idle yet: poll again)
        deadline = time.monotonic() + 20
        while (busy := rpc.rpc_sync("worker1", f.busy_handlers)) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert busy == 0
        # a LEAVE claiming to be another rank than the one its connection was admitted as
        s.send_multipart([wire.pack_header(wire.Kind.LEAVE, 0, 1, "forged"), b""])
        time.sleep(0.5)
        assert rpc.rpc_sync("worker1", f.nested_call, ("worker0", f.add, (1, 2))) == 3
        # the shutdown barrier is rank 0's: nobody else holds it, nobody arrives for rank 0
        s.send_multipart([wire.pack_header(wire.Kind.CALL, 2, 0), _call("@barrier", [])])
        kind, _, frames = _reply(s)
        assert kind == wire.Kind.ERROR and b"rank 0" in frames[0]
    finally:
        ctx.destroy(linger=0)
    assert rpc.rpc_sync("worker1", f.add, (1, 1)) == 2


def test_an_oversized_message_disconnects_the_sender_only(rpc_world):
    rpc_world(1, max_message_size=1 << 20)
    ctx, s = _raw(1)
    try:
        s.send_multipart([wire.pack_header(wire.Kind.CALL, 1, 0), b"\x00" * (2 << 20)])
        assert not s.poll(500)  # dropped by libzmq before any decoding
    finally:
        ctx.destroy(linger=0)
    assert rpc.rpc_sync("worker1", f.add, (1, 1)) == 2


# ---------------------------------------------------------------------- rendezvous
def _server(world_size=2, timeout=10.0):
    ctx = zmq.Context()
    srv = RendezvousServer(ctx, "tcp://127.0.0.1:0")
    srv.start(world_size, timeout)
    return ctx, srv


def _join(ctx, srv, name, rank, world_size=2, timeout=5.0):
    return join(ctx, srv.address, name, rank, world_size, "tcp://127.0.0.1:1", timeout)


def test_rendezvous_refuses_clashes_on_both_sides_and_tells_late_joiners():
    ctx, srv = _server()
    try:
        errors = []
        first = threading.Thread(target=lambda: errors.append(
            pytest.raises(RendezvousError, _join, ctx, srv, "a", 1)))
        first.start()
        time.sleep(0.3)
        with pytest.raises(RendezvousError, match="claimed by both 'a' and 'b'"):
            _join(ctx, srv, "b", 1)
        first.join(10)
        assert errors and "claimed by both" in str(errors[0].value)
    finally:
        srv.stop()
        ctx.destroy(linger=0)
    ctx, srv = _server()
    try:
        done = []
        t = threading.Thread(target=lambda: done.append(_join(ctx, srv, "w0", 0)))
        t.start()
        _join(ctx, srv, "w1", 1)
        t.join(10)
        with pytest.raises(RendezvousError, match="already complete"):
            _join(ctx, srv, "late", 1)
        raw = ctx.socket(zmq.DEALER)
        raw.connect(srv.address)
        for junk in [b"\xc1", msgpack.packb({"name": 3}), msgpack.packb([1, 2])]:
            raw.send(junk)
            assert raw.poll(5000)
            assert b"malformed registration" in raw.recv()
        raw.close(linger=0)
    finally:
        srv.stop()
        ctx.destroy(linger=0)


def test_rendezvous_timeout_is_short_and_says_what_to_check():
    ctx = zmq.Context()
    try:
        t0 = time.monotonic()
        with pytest.raises(rpc.RpcTimeoutError, match="MASTER_ADDR/MASTER_PORT"):
            join(ctx, "tcp://127.0.0.1:9", "w1", 1, 2, "tcp://127.0.0.1:1", 0.5)
        assert time.monotonic() - t0 < 3
    finally:
        ctx.destroy(linger=0)


def test_a_failed_start_leaves_no_thread_or_socket_behind():
    before = {t.name for t in threading.enumerate()}
    opts = rpc.RpcBackendOptions(init_method="tcp://127.0.0.1:0", rendezvous_timeout=0.5)
    with pytest.raises(RendezvousError, match="timed out"):
        rpc.init_rpc("lonely", rank=0, world_size=2, rpc_backend_options=opts)
    time.sleep(0.3)
    after = {t.name for t in threading.enumerate()}
    assert not {n for n in after - before if n.startswith(("rpc", "ZAP"))}
    assert current_agent() is None

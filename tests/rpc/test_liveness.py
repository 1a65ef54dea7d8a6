"""Liveness: busy processes stay alive, stopped and killed ones are reported (once, naming
them), and a peer dying while this process is starved never hangs or kills its I/O."""
import logging
import os
import selectors
import signal
import subprocess
import sys
import textwrap
import time
import types

import pytest
import zmq

from distgrad.distributed import rpc
from distgrad.rpc import current_agent
from distgrad.rpc.liveness import PeerLiveness
from support import rpc_funcs as f
from support.cut_link import CutLink

pytestmark = pytest.mark.timeout(90)

FAST = dict(heartbeat_interval=0.2, heartbeat_timeout=1.0)  # detection bound: 1 s


# Established connections live on libzmq's heartbeats, without the GIL; a connection that
# drops is admitted again only by the receiver's I/O thread (ZAP runs in Python, PROTOCOL.md
# "Authentication"), and its peers wait for that as long as the receiver's ZeroMQ greets
# them (greeting.py; the relay test below). Both processes hold the GIL for longer than
# the detection bound (3 s), with the default options.
HOLD = rpc.TensorPipeRpcBackendOptions().heartbeat_timeout + 1.0


def test_a_process_holding_the_gil_stays_alive_to_its_peers(rpc_world):
    world = rpc_world(2)  # the default heartbeat options
    # worker1 keeps the GIL in one C call for longer than the detection bound
    busy = rpc.rpc_async("worker1", f.hold_gil, (HOLD,))
    time.sleep(0.5)
    assert rpc.rpc_sync("worker2", f.add, (1, 2)) == 3
    assert busy.wait(20) == world.procs["worker1"].pid
    # and so does this process (the driver): its workers must not give up on it
    f.hold_gil(HOLD)
    assert rpc.rpc_sync("worker1", f.add, (2, 2)) == 4
    assert rpc.rpc_sync("worker2", f.add, (3, 3)) == 6
    assert all(p.poll() is None for p in world.procs.values())


# A server whose connections are admitted in Python (a ZAP handler thread, as a member's
# are), which holds its GIL in one C call for the seconds it reads on stdin.
ADMITS_IN_PYTHON = textwrap.dedent("""
    import ctypes, sys, threading, zmq
    ctx = zmq.Context()
    zap = ctx.socket(zmq.ROUTER)
    zap.bind("inproc://zeromq.zap.01")
    def admit():
        while True:
            try:
                request = zap.recv_multipart()
            except zmq.ZMQError:
                return
            at = request.index(b"")
            zap.send_multipart(request[:at + 1] + [b"1.0", request[at + 2], b"200", b"OK",
                                                   b"1", b""])
    threading.Thread(target=admit, daemon=True).start()
    router = ctx.socket(zmq.ROUTER)
    router.plain_server = True
    print(router.bind_to_random_port("tcp://127.0.0.1"), flush=True)
    for line in sys.stdin:
        print("holding", flush=True)
        ctypes.PyDLL(None).usleep(int(float(line) * 1e6))
        print("held", flush=True)
""")


def _line(proc, timeout=20.0):
    sel = selectors.DefaultSelector()
    sel.register(proc.stdout, selectors.EVENT_READ)
    assert sel.select(timeout), "the server said nothing"
    return proc.stdout.readline().strip()


@pytest.mark.parametrize("server", ["holds its GIL", "is stopped"])
def test_a_connection_that_drops_while_its_peer_holds_the_gil_waits_for_it(server):
    # The connection drops (a network blip: the relay cuts it) while the peer cannot admit
    # its reconnection, which takes its Python: one that holds its GIL is waited for, as
    # long as its ZeroMQ greets; a stopped one is reported within the bound.
    options = types.SimpleNamespace(heartbeat_interval=0.2, heartbeat_timeout=1.0)
    proc = subprocess.Popen([sys.executable, "-c", ADMITS_IN_PYTHON], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    ctx = zmq.Context()
    link = None
    try:
        link = CutLink(("127.0.0.1", int(_line(proc))))
        reports = []
        handlers = types.SimpleNamespace(
            on_peer_down=lambda rank, why, left: reports.append(why),
            on_peer_up=lambda rank: reports.append("up"))
        liveness = PeerLiveness(0, options, handlers)
        dealer = ctx.socket(zmq.DEALER)
        dealer.linger = 0
        dealer.plain_username, dealer.plain_password = b"1", b"token"
        liveness.set_heartbeats(dealer, carries_messages=False)
        poller = zmq.Poller()
        poller.register(liveness.watch(dealer, 1, link.endpoint), zmq.POLLIN)
        dealer.connect(link.endpoint)

        def follow(seconds, until):
            end = time.monotonic() + seconds
            while time.monotonic() < end and not until():
                for mon, _ in poller.poll(20):
                    liveness.on_monitor(mon)
                liveness.expire(time.monotonic())
            return until()

        assert follow(10, lambda: 1 not in liveness._probation)   # admitted
        hold = 4 * options.heartbeat_timeout
        if server == "holds its GIL":
            proc.stdin.write(f"{hold}\n")
            proc.stdin.flush()
            assert _line(proc) == "holding"
        else:
            os.kill(proc.pid, signal.SIGSTOP)
        t0 = time.monotonic()
        link.cut()
        if server == "holds its GIL":
            assert not follow(hold - 0.5, lambda: reports), reports
            assert _line(proc) == "held"
            assert follow(10, lambda: 1 not in liveness._suspect) and reports == []
        else:
            assert follow(10, lambda: reports)
            assert reports == [f"no heartbeat for {options.heartbeat_timeout:.1f} s"]
            assert time.monotonic() - t0 < options.heartbeat_timeout + 1.0
    finally:
        if server == "is stopped":
            os.kill(proc.pid, signal.SIGCONT)
        proc.kill()
        proc.wait()
        if link is not None:
            link.close()
        ctx.destroy(linger=0)


def test_a_stopped_worker_is_reported_within_the_bound_and_revives(rpc_world, caplog):
    world = rpc_world(1, **FAST)
    pending = rpc.rpc_async("worker1", f.sleep_and_return, (0.5, "late"))
    socks = current_agent().transport.own_sockets.mine()   # this thread's own sockets
    before = socks[1].identity
    os.kill(world.procs["worker1"].pid, signal.SIGSTOP)
    t0 = time.monotonic()
    try:
        with pytest.raises(rpc.WorkerUnreachableError, match="worker1"):
            pending.wait(10)
        assert time.monotonic() - t0 < 1.0 + 1.5
    finally:
        os.kill(world.procs["worker1"].pid, signal.SIGCONT)
    deadline = time.monotonic() + 10
    while current_agent().unreachable(1) is not None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert rpc.rpc_sync("worker1", f.add, (1, 1)) == 2  # it answers again, it did not exit
    assert world.procs["worker1"].poll() is None
    # on a socket of its own: the old one's connection may have dropped, and made again it
    # would present an identity worker1 may still hold (never handed over)
    assert socks[1].identity != before


def test_a_killed_worker_is_reported_fast_once_and_in_one_line(rpc_world, caplog):
    world = rpc_world(2)
    slow = rpc.rpc_async("worker1", f.sleep_and_return, (30.0,))
    time.sleep(0.2)
    caplog.set_level(logging.INFO, logger="distgrad.rpc")
    t0 = time.monotonic()
    world.kill("worker1")
    with pytest.raises(rpc.WorkerUnreachableError, match="worker1"):
        slow.wait(10)
    assert time.monotonic() - t0 < 1.5
    time.sleep(0.5)
    lines = [r for r in caplog.records if "worker1" in r.getMessage()]
    assert len(lines) == 1 and lines[0].exc_info is None, [r.getMessage() for r in lines]
    assert "1 pending calls" in lines[0].getMessage()
    assert rpc.rpc_sync("worker2", f.add, (1, 2)) == 3


def test_a_peer_killed_while_this_process_is_starved(rpc_world):
    world = rpc_world(2)
    pending = rpc.rpc_async("worker1", f.sleep_and_return, (30.0,))
    pid = world.procs["worker1"].pid
    subprocess.Popen(["sh", "-c", f"sleep 0.5; kill -9 {pid}"])
    f.hold_gil(2.0)  # the peer dies while no thread of ours runs
    with pytest.raises(rpc.WorkerUnreachableError, match="worker1"):
        pending.wait(10)
    assert current_agent().transport.running()  # the I/O thread survived
    assert rpc.rpc_async("worker2", f.add, (2, 3)).wait(10) == 5
    fut = rpc.rpc_async("worker1", f.add, (1, 1))
    with pytest.raises(rpc.WorkerUnreachableError):
        fut.wait(10)


def test_the_io_thread_never_dies_silently(rpc_world):
    world = rpc_world(1)
    agent = current_agent()
    pending = rpc.rpc_async("worker1", f.sleep_and_return, (0.3,))

    def broken(*a):
        raise MemoryError("injected")
    agent.transport._on_router = broken  # the next reply (replies come to the router) kills it
    with pytest.raises(rpc.RpcError, match="I/O thread failed with MemoryError: injected"):
        pending.wait(10)
    with pytest.raises(rpc.RpcError, match="I/O thread failed"):
        rpc.rpc_async("worker1", f.add, (1, 2)).wait(5)
    with pytest.raises(rpc.RpcError):
        rpc.rpc_sync("worker1", f.add, (1, 2))
    # the worker was told this process left: it does not report a death
    deadline = time.monotonic() + 5
    text = ""
    while "left the world" not in text and time.monotonic() < deadline:
        time.sleep(0.1)
        text = world.log_text("worker1")
    assert "left the world" in text and "unreachable" not in text, text
    rpc.shutdown(graceful=False)

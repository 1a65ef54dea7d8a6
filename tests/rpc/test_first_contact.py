"""A world's first calls between two processes pay for nothing that could be done before:
the new connection's handshake is answered at once, distgrad's own entry points resolve
without importing the public API, and a small world's I/O threads (and the handler
thread that serves the first call) connect to every peer when it is formed.

Each test fails on the code before the change it covers, by behaviour rather than by
time: a handshake held back for a minute, a table of the public API built, a socket made
on first use.
"""
import subprocess
import sys
import textwrap
import threading
import time

import pytest

from distgrad.distributed import rpc
from support import rpc_funcs as f

pytestmark = pytest.mark.timeout(90)


def test_a_new_threads_first_call_is_answered_while_messages_flow(rpc_world):
    # While messages flow, the I/O thread polls only its busy sockets until the quiet ones'
    # turn comes. A new connection's handshake waits for the ZAP handler (authentication),
    # so it must be among the busy ones: with the quiet ones' turn a minute away, a new
    # thread's first call still gets through.
    rpc_world(1)
    old = rpc.rpc_sync("worker1", f.set_quiet_sockets_interval, (60.0,))
    try:
        # the busy window that call opened is the old one (10 ms): once it is over, the
        # next request meets a full poll, which opens a window of 60 s
        time.sleep(0.5)
        assert rpc.rpc_sync("worker1", f.add, (1, 2)) == 3
        out = []

        def first_call():
            try:
                out.append(rpc.rpc_sync("worker1", f.add, (2, 3), timeout=20))
            except Exception as e:  # noqa: BLE001 - reported below
                out.append(e)

        t = threading.Thread(target=first_call)
        t.start()
        t.join(30)
        assert out == [5]
    finally:
        rpc.rpc_sync("worker1", f.set_quiet_sockets_interval, (old,))


def test_distgrads_own_entry_points_resolve_without_importing_the_public_api():
    # The public API's table imports every public namespace the first time it is built
    # (30 ms); distributed autograd's entry points are resolved on the I/O thread, which
    # never imports, and a coordinator's first backward waited for it.
    code = textwrap.dedent("""
        import distgrad.distributed.rpc  # what a process in a world has imported
        from distgrad.rpc import allowlist
        list_ = allowlist.Allowlist()
        for ref in ("distgrad.distributed.autograd.engine:_deliver",
                    "distgrad.distributed.autograd.engine:_part_done",
                    "distgrad.distributed.autograd.recording:_installed"):
            list_.resolve(ref)
        assert allowlist._defaults is None, "the public API's table was built"
        import operator
        assert list_.resolve("operator:add") is operator.add  # the table, when needed
        assert allowlist._defaults is not None
    """)
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_a_small_world_connects_the_io_threads_sockets_to_every_peer_at_start(rpc_world):
    rpc_world(2)
    for name in ("worker1", "worker2"):
        rank = int(name[-1])
        assert rpc.rpc_sync(name, f.io_socket_peers) == [r for r in range(3) if r != rank]
    assert f.io_socket_peers() == [1, 2]


def test_a_small_worlds_next_handler_thread_connects_to_every_peer_once_it_is_formed(
        rpc_world):
    # the thread of this process's handler pool that serves the next call (the coordinator's:
    # no peer's call can reach it before the world is formed) has a socket of its own to
    # every peer before it ever sent anything
    import queue

    from distgrad.rpc import current_agent
    rpc_world(2)
    agent = current_agent()
    deadline = time.monotonic() + 30
    while agent.pool.busy():  # its own job done: that thread is the next to serve
        assert time.monotonic() < deadline, "the handler pool stays busy"
        time.sleep(0.01)
    seen = queue.Queue()
    for _ in range(3):  # one after the other: the same thread each time
        agent.pool.submit(lambda: seen.put(sorted(agent.transport.own_sockets.mine())))
        assert seen.get(timeout=30) == [1, 2]


def test_a_handler_connects_for_its_reply_before_it_runs_the_request(rpc_world):
    # worker2 calls worker1 for the first time: the handler serving it has its socket back
    # to worker2 while the function runs (the handshake overlaps the work), not only once
    # it replies
    rpc_world(2)
    assert rpc.rpc_sync("worker2", f.ask_whether_it_has_a_socket_back, ("worker1", 2)) is True

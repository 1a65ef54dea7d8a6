"""distgrad.utils.socket_monitor reads a ZeroMQ socket monitor's events as pyzmq does,
without importing asyncio for it."""
import struct
import subprocess
import sys

import pytest
import zmq

from distgrad.utils.socket_monitor import monitor_event, recv_monitor_event

pytestmark = pytest.mark.timeout(60)


def test_a_connection_reports_its_events_with_their_values():
    ctx = zmq.Context()
    server, client = ctx.socket(zmq.ROUTER), ctx.socket(zmq.DEALER)
    try:
        port = server.bind_to_random_port("tcp://127.0.0.1")
        monitor = client.get_monitor_socket()
        client.connect(f"tcp://127.0.0.1:{port}")
        seen = {}
        while zmq.EVENT_HANDSHAKE_SUCCEEDED not in seen:
            assert monitor.poll(10_000), f"no handshake within 10 s; events: {seen}"
            event, value = recv_monitor_event(monitor)
            seen[event] = value
        # what pyzmq's own reader reports for the same messages
        assert zmq.EVENT_CONNECTED in seen and seen[zmq.EVENT_CONNECTED] > 0  # the fd
        assert seen[zmq.EVENT_HANDSHAKE_SUCCEEDED] == 0
        client.disable_monitor()
        monitor.close(linger=0)
    finally:
        client.close(linger=0)
        server.close(linger=0)
        ctx.term()


def test_it_reads_what_pyzmq_reads():
    from zmq.utils.monitor import parse_monitor_message
    frames = [struct.pack("=hi", zmq.EVENT_DISCONNECTED, 17), b"tcp://127.0.0.1:5555"]
    ours, theirs = monitor_event(frames), parse_monitor_message(frames)
    assert ours == (theirs["event"], theirs["value"]) == (zmq.EVENT_DISCONNECTED, 17)


@pytest.mark.parametrize("frames,sizes", [([b"x" * 6], "[6]"), ([b"short", b"tcp://x"], "[5, 7]"),
                                          ([], "[]")])
def test_anything_else_is_refused_naming_what_it_is(frames, sizes):
    with pytest.raises(ValueError) as e:
        monitor_event(frames)
    assert str(e.value) == (f"not a socket monitor's event: frames of {sizes} bytes "
                            "(an event is 6, then its endpoint)")


def test_starting_rpc_does_not_import_asyncio():
    code = ("import sys, distgrad.distributed.rpc, distgrad.distributed.autograd, "
            "distgrad.offload.store.client; print(sorted({'asyncio', 'ssl'} & set(sys.modules)))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["[]"]

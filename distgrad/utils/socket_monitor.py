"""The events of a ZeroMQ socket monitor (``socket.get_monitor_socket()``), read here.

libzmq sends each event as two frames: 6 bytes (the event, a 16-bit number, then its
value, 32 bits, in this machine's byte order) and the endpoint. pyzmq reads them in
``zmq.utils.monitor``, which imports ``zmq.asyncio`` and with it asyncio and ssl: about
20 ms of every process that starts RPC, for a struct unpack.
"""
import struct

import zmq

__all__ = ["monitor_event", "recv_monitor_event"]

_EVENT = struct.Struct("=hi")


def monitor_event(frames):
    """(event, value) of one monitor message, as raw frames (bytes)."""
    if len(frames) != 2 or len(frames[0]) != _EVENT.size:
        raise ValueError(f"not a socket monitor's event: frames of "
                         f"{[len(f) for f in frames]} bytes (an event is 6, then its endpoint)")
    return _EVENT.unpack(frames[0])


def recv_monitor_event(monitor, flags=0):
    """(event, value) of the next event on ``monitor`` (``zmq.Again`` with ``zmq.NOBLOCK``
    and none waiting)."""
    return monitor_event(monitor.recv_multipart(flags))

"""An outsider of a world: a socket without the world's credentials (or with guessed ones)
that connects to a member and tries to talk to it."""
import time

import zmq
from zmq.utils.monitor import recv_monitor_message

__all__ = ["outsider_events", "REFUSED"]


def outsider_events(endpoint, frames_list, **options):
    """Connect to ``endpoint`` without this world's credentials (or with ``options``), send
    each message of ``frames_list``; return (answers received, handshake events seen)."""
    ctx = zmq.Context()
    s = ctx.socket(zmq.DEALER)
    s.linger = 0
    s.sndtimeo = 5000
    for k, v in options.items():
        setattr(s, k, v)
    monitor = s.get_monitor_socket()   # before connecting: a refusal can come at once
    s.connect(endpoint)
    try:
        for frames in frames_list:
            try:   # (waits up to sndtimeo for the connection's pipe)
                s.send_multipart(frames)
            except zmq.Again:   # refused before anything could even be queued
                break
        events, answers = set(), 0
        deadline = time.monotonic() + 20   # a refusal comes at once; a loaded machine is slow
        quiet_until = None                 # after it, a moment more for a stray answer
        while time.monotonic() < (quiet_until or deadline):
            if monitor.poll(50):
                events.add(recv_monitor_message(monitor)["event"])
            while s.poll(0):
                s.recv_multipart()
                answers += 1
            if quiet_until is None and events & REFUSED:
                quiet_until = time.monotonic() + 0.3
        return answers, events
    finally:
        ctx.destroy(linger=0)


REFUSED = {zmq.EVENT_HANDSHAKE_FAILED_AUTH, zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL,
           zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL}

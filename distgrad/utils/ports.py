"""A TCP port that is free now, for a rendezvous address chosen before anyone binds it."""
import random
import socket

__all__ = ["free_port"]

_LINUX_EPHEMERAL = (32768, 60999)
_LOWEST = 10000  # below: the well-known and registered ports services tend to use


def _ephemeral_range():
    """The ports the kernel hands out for ``bind(0)`` and outgoing connections."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as fh:
            lo, hi = (int(x) for x in fh.read().split())
        return lo, hi
    except (OSError, ValueError):
        return _LINUX_EPHEMERAL


def _binds(host, port):
    with socket.socket() as s:
        try:
            s.bind((host, port))
        except OSError:
            return False
        return True


def free_port(host="127.0.0.1"):
    """A port nobody uses at ``host`` now. The socket that found it is closed again, so
    another process could take it before the caller binds it: use it at once.

    It is drawn at random outside the kernel's ephemeral range when there is room: a port
    from ``bind(0)`` would be handed out again to the next outgoing connection or port-0
    listener of any process on the machine (ZeroMQ binds port 0 all the time), and the
    caller's later bind would fail with EADDRINUSE."""
    lo, hi = _ephemeral_range()
    ranges = [r for r in ((_LOWEST, lo - 1), (hi + 1, 65535)) if r[1] - r[0] >= 1000]
    rng = random.SystemRandom()
    for _ in range(100 if ranges else 0):
        first, last = rng.choice(ranges)
        port = rng.randint(first, last)
        if _binds(host, port):
            return port
    with socket.socket() as s:  # no room outside the ephemeral range (or all taken)
        s.bind((host, 0))
        return s.getsockname()[1]

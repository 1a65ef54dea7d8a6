"""A TCP port that is free now, for a rendezvous address chosen before anyone binds it."""
import socket

__all__ = ["free_port"]


def free_port(host="127.0.0.1"):
    """A port nobody listens on at ``host`` now. The socket that found it is closed again,
    so another process could take it before the caller binds it: use it at once."""
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]

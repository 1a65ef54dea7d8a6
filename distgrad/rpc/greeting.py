"""Whether a peer's ZeroMQ runs, asked without its Python: the greeting probe.

A process that holds its GIL (one long C call) keeps its established connections, since
libzmq's own thread answers their heartbeats; but a connection that drops meanwhile is
admitted again only by its ZAP handler, which is Python (``admission.py``), so the
reconnection waits for the GIL. To its peers that looks like a stopped process, whose
reconnection never completes either. What tells them apart is libzmq's thread: on every
connection it accepts it sends the 10-byte ZMTP signature at once (``0xFF``, 8 bytes,
``0x7F``), before any mechanism or ZAP. A stopped process's kernel still accepts the
connection, but nobody writes; a killed one refuses it.

A :class:`GreetingProbe` is one such connection, read without blocking (by the I/O
thread, between polls) and closed as soon as the signature came: the peer's process
runs. It never gets as far as the handshake, so it costs the peer no Python at all.
"""
import errno
import socket

from ..utils.addresses import host_port

__all__ = ["GreetingProbe"]

_SIGNATURE = 10


class GreetingProbe:
    """A connection to the ZeroMQ endpoint ``endpoint`` (``tcp://`` or ``ipc://``) that
    listens for libzmq's greeting; :meth:`answered` says whether it came."""

    def __init__(self, endpoint):
        self.heard = False
        self._got = b""
        self._sock = None
        try:
            if endpoint.startswith("ipc://"):
                s, target = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM), endpoint[6:]
            else:
                host, port = host_port(endpoint)
                s = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
                target = (host, port)
        except (OSError, ValueError):
            return
        s.setblocking(False)
        self._sock = s
        if s.connect_ex(target) not in (0, errno.EINPROGRESS, errno.EAGAIN):  # EAGAIN: ipc
            self.close()

    def answered(self):
        """Whether the peer's ZeroMQ sent its greeting (reads what came; never blocks)."""
        s = self._sock
        if s is None:
            return self.heard
        try:
            data = s.recv(_SIGNATURE - len(self._got))
        except (BlockingIOError, InterruptedError):
            return False
        except OSError:   # refused, reset, unreachable
            self.close()
            return False
        if not data:      # closed before a greeting
            self.close()
            return False
        self._got += data
        if len(self._got) == _SIGNATURE:
            self.heard = self._got[0] == 0xFF and self._got[-1] == 0x7F
            self.close()
        return self.heard

    def close(self):
        if self._sock is not None:
            self._sock.close()
            self._sock = None

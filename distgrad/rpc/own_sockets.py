"""The sockets each thread of a process owns (``transport.py``'s "own sockets"): a
thread's DEALER to a peer, made on first use and kept in the thread's local storage, so
that a message leaves from the thread that produced it and a socket is never shared.

A thread keeps sockets to at most :data:`OWN_SOCKETS_PER_THREAD` peers (what it sends
further goes through the I/O thread: ``Transport._relay``); a socket whose peer came back
after it was reported down is made anew; the sockets close when their thread ends.
"""
import threading

import zmq

__all__ = ["OwnSockets", "OWN_SOCKETS_PER_THREAD"]

#: Peers a thread keeps sockets of its own to; it hands messages to others to the I/O thread
#: (a handler pool that answered everyone of 1,000 ranks would otherwise hold 16,000).
OWN_SOCKETS_PER_THREAD = 16
_OWN_LINGER = 1000  # ms a thread's last messages may take to leave after it ends


class _ThreadSockets(dict):
    """A thread's own sockets (peer rank -> DEALER), closed when the thread ends (its
    thread-local storage dies with it, on that thread). What they still hold leaves
    within the linger. ``revival[rank]``: the peer's revivals when its socket was made."""

    def __init__(self):
        super().__init__()
        self.revival = {}

    def __del__(self):
        for s in self.values():
            try:
                s.close(linger=_OWN_LINGER)
            except Exception:  # noqa: BLE001 - the context is already gone
                pass


class OwnSockets:
    """Every thread's own sockets of one transport. ``make(dst)`` makes a connected socket
    to rank ``dst``; ``revivals`` (rank -> how often it came back after it was reported
    down) is the liveness' table, read here."""

    def __init__(self, make, revivals):
        self._make, self._revivals = make, revivals
        self._tls = threading.local()  # .socks: the calling thread's

    def get(self, dst):
        """The calling thread's own socket to ``dst``, made on first use (and anew once
        ``dst`` came back after it was reported down); None when the thread keeps sockets
        to its share of peers already."""
        revivals = self._revivals
        socks = getattr(self._tls, "socks", None)
        if socks is None:
            socks = self._tls.socks = _ThreadSockets()
        sock = socks.get(dst)
        if sock is not None and revivals and socks.revival.get(dst) != revivals.get(dst):
            _drop_stale(socks, dst)
            sock = None
        if sock is None:
            if len(socks) >= OWN_SOCKETS_PER_THREAD:
                return None
            sock = socks[dst] = self._make(dst)
            socks.revival[dst] = revivals.get(dst)
        return sock

    def connect_ahead(self, ranks):
        """Make the calling thread's own sockets to ``ranks`` now, before it sends to them.
        A thread's first call to a peer waits for the new connection's handshake (1.3 ms
        against 0.6 ms for its second), and a chain's first step paid that at every hop: the
        handler thread that will serve a world's first call does this once it is formed
        (``lifecycle.py``). One thread only: every thread of the pool doing it took 4
        sockets a peer instead of 1 (154 more file descriptors a process in a world of 16)
        and slowed the world's first all-to-all by a third."""
        for r in ranks:
            try:
                if self.get(r) is None:  # the thread's share of peers is full
                    return
            except zmq.ZMQError:  # closing meanwhile
                return

    def mine(self):
        """The calling thread's own sockets (rank -> socket), to be read, not changed."""
        socks = getattr(self._tls, "socks", None)
        return {} if socks is None else socks


def _drop_stale(socks, dst):
    """Drop a thread's socket to ``dst``, which came back after it was reported down: that
    socket's connection may have dropped meanwhile, and one it made again would present its
    identity while ``dst`` still holds the old connection, which is never handed over
    (``Transport.bind``). A new socket has an identity of its own. What the old one still
    held belonged to calls that failed when ``dst`` went down."""
    socks.pop(dst).close(linger=0)
    socks.revival.pop(dst, None)

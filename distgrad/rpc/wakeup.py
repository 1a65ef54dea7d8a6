"""A wake-up signal for a thread that waits in ``zmq.poll``: an eventfd (a pipe elsewhere)
that the thread polls beside its sockets."""
import os
import threading

__all__ = ["Wakeup"]


class Wakeup:
    """Wakes the I/O thread (work was queued for its ``on_tick``): edge-safe (the I/O
    thread clears it before it looks at the work) and never blocking the signaller.

    Signalling after :meth:`close` does nothing. It must not write: a closed descriptor's
    number is soon another file's (a socket's, libzmq's own mailbox), and finalizers
    signal from any thread at any time, also long after the transport closed (a view of a
    peer's shared memory that outlived its world, collected with a reference cycle)."""

    def __init__(self):
        self._lock = threading.Lock()  # a signal and close never interleave
        if hasattr(os, "eventfd"):
            self.fd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
            self._w = self.fd
        else:  # pragma: no cover - not Linux
            self.fd, self._w = os.pipe()
            os.set_blocking(self.fd, False)
            os.set_blocking(self._w, False)
        self.closed = False

    def signal(self):
        with self._lock:
            if self.closed:
                return
            try:
                os.write(self._w, b"\x01\x00\x00\x00\x00\x00\x00\x00")
            except OSError:  # full: the reader will wake anyway
                pass

    def clear(self):
        with self._lock:
            if self.closed:
                return
            try:
                os.read(self.fd, 4096)
            except (BlockingIOError, OSError):
                pass

    def close(self):
        with self._lock:
            if self.closed:
                return
            self.closed = True
            for fd in {self.fd, self._w}:
                try:
                    os.close(fd)
                except OSError:
                    pass

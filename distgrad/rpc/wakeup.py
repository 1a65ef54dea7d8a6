"""A wake-up signal for a thread that waits in ``zmq.poll``: an eventfd (a pipe elsewhere)
that the thread polls beside its sockets."""
import os

__all__ = ["Wakeup"]


class Wakeup:
    """Wakes the I/O thread (work was queued for its ``on_tick``): edge-safe (the I/O
    thread clears it before it looks at the work) and never blocking the signaller."""

    def __init__(self):
        if hasattr(os, "eventfd"):
            self.fd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
            self._w = self.fd
        else:  # pragma: no cover - not Linux
            self.fd, self._w = os.pipe()
            os.set_blocking(self.fd, False)
            os.set_blocking(self._w, False)

    def signal(self):
        try:
            os.write(self._w, b"\x01\x00\x00\x00\x00\x00\x00\x00")
        except OSError:  # full (the reader will wake anyway) or closed (shut down)
            pass

    def clear(self):
        try:
            os.read(self.fd, 4096)
        except (BlockingIOError, OSError):
            pass

    def close(self):
        for fd in {self.fd, self._w}:
            try:
                os.close(fd)
            except OSError:
                pass

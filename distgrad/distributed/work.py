"""``Work``: the handle of a collective, what ``async_op=True`` returns."""
from distgrad.futures import Future

from .errors import DistBackendError
from .store import seconds

__all__ = ["Work"]


class Work:
    """The handle of a collective (``torch.distributed.Work``): ``wait``, ``is_completed``,
    ``get_future``; what a collective with ``async_op=True`` returns."""

    def __init__(self, result=None):
        self._fut = Future()
        self._result = result if result is not None else []
        self._source = -1

    # the communicator completes it (on its I/O thread, or inline for a one-rank group)
    def _finish(self, exc=None, pool=None):
        fut = self._fut
        if pool is not None and fut.has_blocking_callbacks():  # user callbacks may block: not here
            pool.submit(fut._complete, None if exc else self._result, exc)
        else:
            fut._complete(None if exc else self._result, exc)

    def wait(self, timeout=None):
        """Block until the collective finished; raise its error. ``timeout`` (a timedelta
        or seconds; 0 or None waits for as long as the group's own timeout allows)."""
        t = seconds(timeout)
        if not self._fut.wait_done(t if t else None):
            raise DistBackendError(f"Work.wait() timed out after {t:g} s (the collective "
                                   "itself goes on)")
        self._fut.value()
        return True

    def is_completed(self):
        return self._fut.done()

    def is_success(self):
        return self._fut.done() and self._fut.exception() is None

    def exception(self):
        return self._fut.exception() if self._fut.done() else None

    def get_future(self):
        """A Future completed with the output tensors (a list) when the work is done."""
        return self._fut

    def result(self):
        self.wait()
        return self._result

    def source_rank(self):
        """The sender's rank of a finished ``irecv`` (from any source)."""
        return self._source

    def synchronize(self):
        self.wait()

    def block_current_stream(self):  # CPU only: there is no stream to block
        self.wait()

"""``torch.futures``: a small thread-safe Future, the one RPC returns, and its helpers.

Waiting uses a pre-acquired lock that completion releases: the cheapest
cross-thread wake-up CPython offers, which keeps the RPC round trip lean.

Callbacks run on the thread that completes the Future. RPC completes Futures on
its I/O thread, where a user's callback must not run (it may block); distgrad's
own callbacks that never block say so (``_add_inline_callback``) and run right
there, which spares a thread hand-off (``has_blocking_callbacks``).
"""
import threading
import time

__all__ = ["Future", "collect_all", "wait_all"]

_PENDING = object()


class Future:
    """Result of an asynchronous call.

    >>> f = Future(); f.set_result(3); f.then(lambda fut: fut.value() + 1).wait()
    4
    """
    __slots__ = ("_lock", "_result", "_exc", "_callbacks", "_cb_lock", "_blocking", "_waited")

    def __init__(self):
        self._lock = threading.Lock()
        self._lock.acquire()
        self._result = _PENDING
        self._exc = None
        self._callbacks = None
        self._cb_lock = threading.Lock()
        self._blocking = False  # some callback may block (a user's)
        self._waited = False    # a thread has blocked in wait() (completing it wakes one)

    def done(self):
        return self._result is not _PENDING

    def has_blocking_callbacks(self):
        """Whether completing this Future runs callbacks that may block (a user's), so it
        should not be completed on an I/O thread."""
        return self._blocking

    def has_waiter(self):
        """Whether a thread blocked waiting for this Future (completing it wakes one)."""
        return self._waited

    def _complete(self, result, exc):
        with self._cb_lock:
            if self._result is not _PENDING:
                return False
            self._exc = exc
            self._result = result
            callbacks, self._callbacks = self._callbacks, None
        self._lock.release()
        for cb in callbacks or ():
            _run_callback(cb, self)
        return True

    def set_result(self, result):
        if not self._complete(result, None):
            raise RuntimeError("Future already completed")

    def set_exception(self, exc):
        if not self._complete(None, exc):
            raise RuntimeError("Future already completed")

    def _try_set_exception(self, exc):
        return self._complete(None, exc)

    def wait_done(self, timeout=None):
        """Wait until done or ``timeout`` seconds pass; return whether it is done (no raise)."""
        if self._result is _PENDING:
            self._waited = True
            if not self._lock.acquire(timeout=-1 if timeout is None else max(timeout, 0)):
                return False
            self._lock.release()
        return True

    def wait(self, timeout=None):
        """Block until done (or ``timeout`` seconds); return the value or raise its error."""
        if not self.wait_done(timeout):
            raise TimeoutError(f"Future not completed within {timeout} s")
        return self.value()

    def value(self):
        if self._result is _PENDING:
            raise RuntimeError("Future is not completed yet")
        if self._exc is not None:
            raise self._exc
        return self._result

    def exception(self):
        return self._exc if self.done() else None

    def add_done_callback(self, callback):
        """Call ``callback(self)`` once done (immediately if already done)."""
        self._add(callback, blocking=True)

    def _add_inline_callback(self, callback):
        """``add_done_callback`` for a callback of distgrad's own that never blocks: it may
        run on the I/O thread that completes the Future."""
        self._add(callback, blocking=False)

    def _add(self, callback, blocking):
        with self._cb_lock:
            if self._result is _PENDING:
                if self._callbacks is None:
                    self._callbacks = []
                self._callbacks.append(callback)
                if blocking:
                    self._blocking = True
                return
        _run_callback(callback, self)

    def then(self, callback):
        """Return a Future completed with ``callback(self)`` (or its exception)."""
        nxt = Future()

        def chain(fut):
            try:
                nxt.set_result(callback(fut))
            except BaseException as e:  # noqa: BLE001 - the error belongs to the chained Future
                nxt.set_exception(e)
        self.add_done_callback(chain)
        return nxt


def _run_callback(cb, fut):
    try:
        cb(fut)
    except Exception:  # a broken callback must not break the I/O thread
        import logging
        logging.getLogger("distgrad.rpc").exception("Future callback failed")


def collect_all(futures):
    """A Future completed with the list of ``futures`` once all are done."""
    out = Future()
    futures = list(futures)
    if not futures:
        out.set_result([])
        return out
    remaining = [len(futures)]
    lock = threading.Lock()

    def one(_):
        with lock:
            remaining[0] -= 1
            last = remaining[0] == 0
        if last:
            out.set_result(futures)
    for f in futures:
        f.add_done_callback(one)  # not inline: it completes ``out``, whose callbacks may block
    return out


def wait_all(futures, timeout=None):
    """The values of ``futures`` once all are done. As PyTorch's: the first error any of
    them completes with is raised at once, without waiting for the others (a call that
    failed fast is not hidden behind one that hangs); ``timeout`` (ours) bounds the
    whole wait."""
    futures = list(futures)
    finished = threading.Semaphore(0)
    for f in futures:  # releasing a semaphore never blocks: fine on an I/O thread
        f._add_inline_callback(lambda _f: finished.release())
    deadline = None if timeout is None else time.monotonic() + timeout
    for _ in futures:
        left = None if deadline is None else max(deadline - time.monotonic(), 0.0)
        if not finished.acquire(timeout=left):
            raise TimeoutError(f"{sum(not f.done() for f in futures)} of {len(futures)} "
                               f"futures not completed within {timeout} s")
        for f in futures:
            if f.exception() is not None:
                raise f.exception()
    return [f.value() for f in futures]

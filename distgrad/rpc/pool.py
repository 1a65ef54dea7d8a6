"""Handler threads: a pool that grows instead of queueing behind busy threads.

A handler that makes a nested RPC blocks its own thread while it waits; if every
thread could be blocked that way, the replies it waits for would starve. So a
request never waits for a busy thread: when none is idle, a new one starts (up to
a large cap). Idle threads beyond ``min_threads`` retire after a while. The pool owns
its threads: :meth:`shutdown` joins them (a job still running after ``join_timeout``
is reported by thread name and stack).
"""
import itertools
import logging
import queue
import threading

from ..utils.lifetimes import join_all

log = logging.getLogger("distgrad.rpc")


class HandlerPool:
    def __init__(self, min_threads=4, max_threads=1024, name="rpc-handler", idle_exit=30.0):
        self._q = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._min = max(1, min_threads)
        self._threads = self._idle = self._min  # started just below
        self.peak = self._min                    # the most threads it ever had at once
        self._max = max_threads
        self._name = name
        self._idle_exit = idle_exit
        self._stopped = False
        self._mine = threading.local()
        self._names = itertools.count(1)
        self._running = set()   # the threads started and not finished (under the lock)
        for _ in range(self._min):
            self._start_thread()

    def busy(self):
        """How many jobs are running or waiting for a thread now."""
        with self._lock:
            return self._threads - self._idle

    def owns_current_thread(self):
        """Whether the calling thread is one of this pool's (serving peers, or callbacks)."""
        return getattr(self._mine, "yes", False)

    def _start_thread(self):
        """Start a thread already counted in ``_threads``. Never with the lock held:
        ``Thread.start`` waits for the new thread to run, which on a loaded machine can
        take long, and every thread finishing a job needs the lock to say it is idle."""
        t = threading.Thread(target=self._run, name=f"{self._name}-{next(self._names)}",
                             daemon=True)
        with self._lock:
            self._running.add(t)
        try:
            t.start()
        except RuntimeError:  # no more threads: the job waits in the queue for a free one
            log.exception("could not start an RPC handler thread")
            with self._lock:
                self._running.discard(t)
                self._threads -= 1
                self._idle -= 1  # keeps busy() = jobs not finished; < 0 until one frees

    def submit(self, fn, *args):
        with self._lock:
            if self._stopped:
                raise RuntimeError("handler pool is shut down")
            spawn = False
            if self._idle > 0:
                self._idle -= 1  # an idle thread will take it
            elif self._threads < self._max:
                self._threads += 1  # a new thread, counted busy until it finishes a job
                self.peak = max(self.peak, self._threads)
                spawn = True
        self._q.put((fn, args))  # first: a thread freed meanwhile may take it at once
        if spawn:
            self._start_thread()

    def _run(self):
        try:
            self._serve()
        finally:
            with self._lock:
                self._running.discard(threading.current_thread())

    def _serve(self):
        self._mine.yes = True
        idle_for = 0.0
        while True:
            try:
                item = self._q.get(timeout=1.0)
            except queue.Empty:
                idle_for += 1.0
                with self._lock:
                    if self._stopped or (idle_for >= self._idle_exit and self._threads > self._min
                                         and self._idle > 0):
                        self._idle -= 1
                        self._threads -= 1
                        return
                continue
            idle_for = 0.0
            fn, args = item
            if fn is None:
                return
            try:
                fn(*args)
            except BaseException:  # noqa: BLE001 - a handler must never kill its thread
                log.exception("RPC handler failed")
            with self._lock:
                self._idle += 1

    def shutdown(self, join_timeout=2.0):
        """Stop taking jobs; every thread ends after its job. Joins them (not the calling
        thread, if it is one of them) for up to ``join_timeout`` seconds; returns the
        threads still running then (reported)."""
        with self._lock:
            self._stopped = True
            n = self._threads
            threads = list(self._running)
        for _ in range(n):
            self._q.put((None, ()))
        return join_all(threads, join_timeout, f"handler pool {self._name!r}")

"""Handler threads: a pool that grows instead of queueing behind busy threads.

A handler that makes a nested RPC blocks its own thread while it waits; if every
thread could be blocked that way, the replies it waits for would starve. So a
request never waits for a busy thread: when none is idle, a new one starts (up to
a large cap). Idle threads beyond ``min_threads`` retire after a while. The pool owns
its threads: :meth:`shutdown` joins them (a job still running after ``join_timeout``
is reported by thread name and stack).

A job goes to the thread that became idle last. Each thread keeps sockets of its own to
the peers it sends to (``transport.py``), made on first use: a chain of calls through
the world, served by whichever thread had waited longest, made a new connection at
every hop until every thread of every process had one (an 8-rank chain needed ~9 passes
to reach its steady time). The thread that served the last call has the sockets, and
its memory is warm; and a job submitted to a pool whose threads are all idle tells which
thread serves the next call: that one (``lifecycle.py`` has it connect to every peer).
"""
import collections
import itertools
import logging
import threading

from ..utils.lifetimes import join_all

log = logging.getLogger("distgrad.rpc")

_STOP = (None, ())  # the job that ends a thread


class _Idle:
    """An idle thread's place in the pool: it waits on ``wake`` (held until a job is put
    in ``job``). A plain lock is the cheapest hand-over between threads in CPython."""

    __slots__ = ("wake", "job")

    def __init__(self):
        self.wake = threading.Lock()
        self.wake.acquire()
        self.job = None


class HandlerPool:
    def __init__(self, min_threads=4, max_threads=1024, name="rpc-handler", idle_exit=30.0):
        self._lock = threading.Lock()
        self._min = max(1, min_threads)
        self._max = max_threads
        self._threads = 0                       # started and not finished
        self._idle = []                         # idle threads' places, most recent last
        self._waiting = collections.deque()     # jobs that found every thread busy, at the cap
        self.peak = self._min                   # the most threads it ever had at once
        self._name = name
        self._idle_exit = idle_exit
        self._stopped = False
        self._mine = threading.local()
        self._names = itertools.count(1)
        self._running = set()   # the threads started and not finished (under the lock)
        for _ in range(self._min):
            with self._lock:
                self._threads += 1
            self._start_thread(None)

    def busy(self):
        """How many jobs are running or waiting for a thread now."""
        with self._lock:
            return self._threads - len(self._idle) + len(self._waiting)

    def owns_current_thread(self):
        """Whether the calling thread is one of this pool's (serving peers, or callbacks)."""
        return getattr(self._mine, "yes", False)

    def _start_thread(self, job):
        """Start a thread already counted in ``_threads``, with ``job`` first. Never with the
        lock held: ``Thread.start`` waits for the new thread to run, which on a loaded
        machine can take long, and every thread finishing a job needs the lock."""
        t = threading.Thread(target=self._run, args=(job,),
                             name=f"{self._name}-{next(self._names)}", daemon=True)
        with self._lock:
            self._running.add(t)
        try:
            t.start()
        except RuntimeError:  # no more threads: the job waits for a free one
            log.exception("could not start an RPC handler thread")
            with self._lock:
                self._running.discard(t)
                self._threads -= 1
                if job is not None:
                    self._waiting.appendleft(job)

    def submit(self, fn, *args):
        with self._lock:
            if self._stopped:
                raise RuntimeError("handler pool is shut down")
            if self._idle:
                place = self._idle.pop()
                place.job = (fn, args)
                place.wake.release()
                return
            if self._threads >= self._max:
                self._waiting.append((fn, args))
                return
            self._threads += 1  # a new thread, counted busy until it finishes its job
            self.peak = max(self.peak, self._threads)
        self._start_thread((fn, args))

    def _run(self, job):
        try:
            self._serve(job)
        finally:
            with self._lock:
                self._running.discard(threading.current_thread())

    def _serve(self, job):
        self._mine.yes = True
        place = _Idle()
        while True:
            if job is not None:
                fn, args = job
                if fn is None:
                    return  # counted out by shutdown
                try:
                    fn(*args)
                except BaseException:  # noqa: BLE001 - a handler must never kill its thread
                    log.exception("RPC handler failed")
                job = fn = args = None  # nothing of the job outlives it while idle
            with self._lock:
                if self._waiting:
                    job = self._waiting.popleft()
                    continue
                if self._stopped:
                    self._threads -= 1
                    return
                self._idle.append(place)
            job = self._wait(place)
            if job is None:
                return

    def _wait(self, place):
        """The next job handed to this idle thread; None once it retires (idle beyond
        ``idle_exit`` with more than ``min_threads`` threads) or the pool stopped."""
        idle_for = 0.0
        while not place.wake.acquire(timeout=1.0):
            idle_for += 1.0
            with self._lock:
                if place not in self._idle:
                    continue  # handed a job just now: its wake is released
                if self._stopped or (idle_for >= self._idle_exit and self._threads > self._min):
                    self._idle.remove(place)
                    self._threads -= 1
                    return None
        job, place.job = place.job, None
        return job

    def shutdown(self, join_timeout=2.0):
        """Stop taking jobs; every thread ends after its job (and the jobs still waiting).
        Joins them (not the calling thread, if it is one of them) for up to
        ``join_timeout`` seconds; returns the threads still running then (reported)."""
        with self._lock:
            self._stopped = True
            threads = list(self._running)
            idle, self._idle = self._idle, []
            self._threads -= len(idle)
            for place in idle:
                place.job = _STOP
                place.wake.release()
        return join_all(threads, join_timeout, f"handler pool {self._name!r}")

"""The iterators a :class:`~distgrad.utils.data.DataLoader` returns.

``_SingleProcessDataLoaderIter`` makes each batch in this process when it is asked for;
``_MultiProcessingDataLoaderIter`` has worker processes make them ahead of time. (The
class names are PyTorch's, for code that looks for them; how they work is described on
each class.) Both take their settings from the loader when they are made.
"""
import collections
import fcntl
import multiprocessing.connection
import os
import sys
import warnings
from multiprocessing.reduction import ForkingPickler

from . import channel
from ... import accelerator
from ..processes import join_all, reap
from ..start_method import default_context, fork_hazards
from ...ops.creation import randint
from .fetch import ITERABLE, create_fetcher
from .worker import RESUME, worker_loop

# How long to wait for workers to exit by themselves before terminating them (an idle
# worker exits at once; a busy one is making a batch nobody will read).
_SHUTDOWN_GRACE = 0.5


def _note(exception, text):
    if hasattr(exception, "add_note"):  # Python 3.11+
        exception.add_note(text)


def _warn_about_pinning(loader):
    """PyTorch's warnings for ``pin_memory`` where there is no accelerator (always, here:
    batches are used as they come)."""
    if not loader.pin_memory:
        return
    if loader.pin_memory_device:
        warnings.warn("pin_memory_device is deprecated, the current accelerator will be used "
                      f"as the device,ignore pin_memory_device='{loader.pin_memory_device}'.",
                      stacklevel=3)
    if not accelerator.is_available():
        warnings.warn("'pin_memory' argument is set as true but no accelerator is found, then "
                      "device pinned memory won't be used.", stacklevel=3)


class _DataLoaderIterBase:
    """One pass over the loader's sampler (several, for persistent workers: see
    ``_reset``), counting the batches handed out."""

    def __init__(self, loader):
        self._dataset = loader.dataset
        self._kind = loader._dataset_kind
        self._batched = loader._auto_collation
        self._drop_last = loader.drop_last
        self._collate = loader.collate_fn
        self._indices = loader._index_sampler
        self._num_workers = loader.num_workers
        self._timeout = loader.timeout
        self._persistent = loader.persistent_workers
        _warn_about_pinning(loader)
        # The workers' seed is drawn from the loader's generator before the sampler draws
        # its order from it (both as in PyTorch, so a seeded shuffle gives one order
        # whatever num_workers is).
        self._order = iter(self._indices)
        self._base_seed = int(randint(0, 2 ** 62, (), generator=loader.generator).item())
        self._handed_out = 0
        self._claimed_len = loader._IterableDataset_len_called
        self._shutdown = False

    def _reset(self, loader):
        """Start the next epoch (the loader calls this on its persistent iterator)."""
        self._order = iter(self._indices)
        self._handed_out = 0
        self._claimed_len = loader._IterableDataset_len_called

    def _next_batch(self):
        raise NotImplementedError

    def __iter__(self):
        return self

    def __next__(self):
        batch = self._next_batch()
        self._handed_out += 1
        if (self._kind == ITERABLE and self._claimed_len is not None
                and self._handed_out > self._claimed_len):
            self._warn_longer_than_claimed()
        return batch

    def _warn_longer_than_claimed(self):
        # PyTorch's words: a user may be matching them
        text = (f"Length of IterableDataset {self._dataset} was reported to be "
                f"{self._claimed_len}(when accessing len(dataloader)), but "
                f"{self._handed_out} samples have been fetched. ")
        if self._num_workers > 0:
            text += ("For multiprocessing data-loading, this could be caused by not properly "
                     "configuring the IterableDataset replica at each worker.")
        warnings.warn(text, stacklevel=3)

    def __len__(self):
        return len(self._indices)

    def __getstate__(self):
        raise NotImplementedError(f"{type(self).__name__} cannot be pickled")


class _SingleProcessDataLoaderIter(_DataLoaderIterBase):
    """Each batch fetched and collated here, when asked for."""

    def __init__(self, loader):
        super().__init__(loader)
        self._fetcher = create_fetcher(self._kind, self._dataset, self._batched, self._collate,
                                       self._drop_last)

    def _next_batch(self):
        # either may raise StopIteration: the sampler is done, or the stream is
        return self._fetcher.fetch(next(self._order))


class _IndexPipe:
    """The parent's end of a worker's index pipe, written without a helper thread.

    A worker reads its next task only after it has written the last batch, and may be
    blocked writing it while the parent writes tasks: a write into a full index pipe
    would then wait forever. So a task is written only if it fits beside every task the
    worker has not answered yet (what can still sit in the pipe), or when there is none
    (the worker is reading, or about to); otherwise it waits (``fits`` is false).
    """

    _HEADER = 4  # bytes a Connection puts before each message

    def __init__(self, writer):
        self.writer = writer
        self.unanswered = {}   # task index -> bytes it took in the pipe
        self.capacity = _pipe_capacity(writer)

    @staticmethod
    def encode(message):
        return bytes(ForkingPickler.dumps(message))

    def fits(self, data):
        size = len(data) + self._HEADER
        return not self.unanswered or sum(self.unanswered.values()) + size <= self.capacity

    def send(self, idx, data):
        try:
            self.writer.send_bytes(data)
        except (BrokenPipeError, ConnectionResetError):
            # the worker has died (it may have just sent the batch being returned now):
            # the task stays unanswered and the next wait for results finds the dead
            # worker and raises naming it, as PyTorch's queue-fed workers do
            pass
        self.unanswered[idx] = len(data) + self._HEADER

    def answered(self, idx):
        self.unanswered.pop(idx, None)

    def forget(self):
        self.unanswered.clear()

    def stop(self):
        """Tell the worker to exit, if the pipe has room now (else it is terminated)."""
        try:
            os.set_blocking(self.writer.fileno(), False)
            self.writer.send(None)  # far below PIPE_BUF: written whole or not at all
        except (OSError, ValueError):  # full, closed, or the worker is gone
            pass

    def close(self):
        self.writer.close()


def _pipe_capacity(conn):
    try:
        return fcntl.fcntl(conn.fileno(), fcntl.F_GETPIPE_SZ)
    except (AttributeError, OSError):  # no F_GETPIPE_SZ (not Linux)
        return 4096  # the least any POSIX pipe holds (PIPE_BUF)


class _Worker:
    """One worker process and the parent's ends of its two pipes.

    A worker answers its tasks one at a time in the order they reach it, so its next
    message is always about ``owed[0]``, the oldest task it has not answered.
    ``streaming`` turns false when its copy of an IterableDataset runs out: from then on
    it answers nothing until the next epoch, and the tasks it still had are void.
    """

    def __init__(self, number, process, tasks, results):
        self.number = number
        self.process = process
        self.tasks = tasks          # _IndexPipe
        self.results = results      # Connection, read by channel.receive
        self.owed = collections.deque()
        self.streaming = True

    @property
    def pid(self):
        return self.process.pid


class _MultiProcessingDataLoaderIter(_DataLoaderIterBase):
    """Batches made ahead of time by ``num_workers`` worker processes.

    The sampler's batches of indices become tasks 0, 1, 2, ... Each task goes to the
    streaming worker after the one that got the task before it (so with all workers
    streaming, task ``n`` goes to worker ``n % num_workers``). The parent starts an epoch
    with ``prefetch_factor * num_workers`` tasks out and sends one more for every answer
    it takes, so the workers run at most that far ahead of the user.

    In order (the default), the next batch is the oldest task's, read from the worker
    that has it: nothing is buffered here, a later batch waits in its worker's pipe.
    With ``in_order=False`` the first answer from any worker is handed out, and a worker
    gets a task only while it holds fewer than its share of them, so that one slow batch
    does not keep others waiting behind it.
    """

    def __init__(self, loader):
        super().__init__(loader)
        self._prefetch_factor = loader.prefetch_factor
        self._in_order = loader.in_order
        context = loader.multiprocessing_context
        self._why_spawned = None
        if context is None:
            context = default_context()
            if context.get_start_method() == "spawn" and fork_hazards():
                self._why_spawned = "; ".join(fork_hazards())
        self._start_method = context.get_start_method()
        self._workers = []
        try:
            for number in range(self._num_workers):
                self._workers.append(self._start_worker(context, number, loader.worker_init_fn))
        except BaseException as e:
            self._stop_workers()
            if self._start_method != "fork" and (
                    isinstance(e, (TypeError, AttributeError))
                    or "pickl" in type(e).__name__.lower()):
                _note(e, f"DataLoader workers start with the {self._start_method!r} method "
                         f"here{self._spawn_reason()}: the dataset, collate_fn and "
                         "worker_init_fn must be picklable (defined at the top level of a "
                         "module)")
            raise
        self._begin_epoch()

    def _start_worker(self, context, number, init_fn):
        task_reader, task_writer = context.Pipe(duplex=False)
        result_reader, result_writer = context.Pipe(duplex=False)
        process = context.Process(
            target=worker_loop, daemon=True,
            args=(self._kind, self._dataset, task_reader, result_writer, self._batched,
                  self._collate, self._drop_last, self._base_seed, init_fn, number,
                  self._num_workers, os.getpid()))
        worker = _Worker(number, process, _IndexPipe(task_writer), result_reader)
        process.start()
        result_writer.close()  # the worker holds the only writer: its death ends the pipe
        task_reader.close()
        return worker

    # ------------------------------------------------------------------ epochs
    def _begin_epoch(self):
        self._next_task = 0        # the number the next task gets
        self._turn = 0             # the worker that the next task is offered to first
        self._unsent = None        # (worker, task, message) waiting for room in its pipe
        self._in_flight = collections.deque()  # in order: (task, worker) not handed out yet
        for worker in self._workers:
            worker.owed.clear()
            worker.streaming = True
        for _ in range(self._prefetch_factor * len(self._workers)):
            self._send_task()

    def _reset(self, loader):
        super()._reset(loader)
        if self._unsent is not None:  # the old epoch's newest task, never sent: dropped
            self._unsent[0].owed.pop()
            self._unsent = None
        for worker in self._workers:
            self._restart_stream(worker)
        self._begin_epoch()

    def _restart_stream(self, worker):
        """A persistent worker's new epoch: drop the answers it still owes for the last
        one, tell it to start its stream again, and wait until it has."""
        while worker.owed:
            task, kind = self._read(worker)[:2]
            if kind == channel.END:
                break  # it owes nothing more
            worker.owed.popleft()
        worker.owed.clear()
        worker.tasks.forget()  # all read: the pipe is empty
        worker.tasks.send(None, _IndexPipe.encode(RESUME))
        while self._read(worker)[1] != channel.RESUMED:
            pass
        worker.tasks.forget()

    # ------------------------------------------------------------------ sending tasks
    def _send_task(self):
        """Send the sampler's next batch of indices to the worker whose turn it is, if one
        may take it and the sampler has one."""
        if not self._send_unsent():
            return  # tasks leave in order: this one would overtake the one waiting
        worker = self._whose_turn()
        if worker is None:
            return
        try:
            indices = next(self._order)
        except StopIteration:
            return
        task, self._next_task = self._next_task, self._next_task + 1
        self._turn = (worker.number + 1) % len(self._workers)
        message = _IndexPipe.encode((task, indices))
        if worker.tasks.fits(message):
            worker.tasks.send(task, message)
        else:
            self._unsent = (worker, task, message)
        worker.owed.append(task)
        if self._in_order:
            self._in_flight.append((task, worker))

    def _whose_turn(self):
        streaming = [w for w in self._workers if w.streaming]
        if not streaming:
            return None
        share = self._prefetch_factor * len(self._workers) // len(streaming)
        count = len(self._workers)
        for step in range(count):
            worker = self._workers[(self._turn + step) % count]
            if worker.streaming and (self._in_order or len(worker.owed) < share):
                return worker
        return None

    def _send_unsent(self):
        """Send the task waiting for room, if its pipe has room now; whether none waits."""
        if self._unsent is None:
            return True
        worker, task, message = self._unsent
        if not worker.tasks.fits(message):
            return False
        self._unsent = None
        worker.tasks.send(task, message)
        return True

    # ------------------------------------------------------------------ receiving batches
    def _next_batch(self):
        while True:
            if self._shutdown:
                raise StopIteration
            self._send_unsent()
            if self._in_order:
                waiting_on = [self._in_flight[0][1]] if self._in_flight else []
            else:
                waiting_on = [w for w in self._workers if w.owed]
            if not waiting_on:  # every task answered or void: the epoch is over
                if not self._persistent:
                    self._stop_workers()
                raise StopIteration
            worker, kind, payload = self._answer(waiting_on)
            if kind == channel.END:
                self._stream_ended(worker)
                self._send_task()
                continue
            self._send_task()
            if kind == channel.ERROR:
                channel.raise_exception(payload)  # the iterator goes on after it
            return payload

    def _answer(self, candidates):
        """``(worker, kind, payload)``: the next answer from the first of ``candidates`` to
        give one, taken off its worker's (and in order, the epoch's) list of tasks."""
        worker = self._first_ready(candidates)
        task, kind, payload = self._read(worker)
        if not worker.owed or task != worker.owed[0]:
            raise RuntimeError(f"DataLoader worker {worker.number} answered task {task}, "
                               f"not {worker.owed[0] if worker.owed else 'none'} as expected")
        worker.owed.popleft()
        worker.tasks.answered(task)
        if self._in_order:
            self._in_flight.popleft()
        return worker, kind, payload

    def _first_ready(self, workers):
        """The first of ``workers`` with something to read or whose process has ended."""
        for worker in workers:
            if worker.results.poll():
                return worker
        watched = [w.results for w in workers] + [w.process.sentinel for w in workers]
        ready = multiprocessing.connection.wait(watched,
                                                self._timeout if self._timeout > 0 else None)
        if not ready:
            raise RuntimeError(f"DataLoader timed out after {self._timeout} seconds")
        return next(w for w in workers if w.results in ready or w.process.sentinel in ready)

    def _read(self, worker):
        """``(task, kind, payload)``: the next message of ``worker``, waited for (at most
        ``timeout``); RuntimeError if its process ends first."""
        self._first_ready([worker])
        if not worker.results.poll():  # its process ended with nothing more to say
            self._lost(worker)
        try:
            return channel.receive(worker.results)
        except channel.WorkerDied:
            self._lost(worker)

    def _stream_ended(self, worker):
        """Its copy of the IterableDataset ran out: no more tasks for it this epoch; the
        ones it was sent after this one stay unanswered (it reads and drops them)."""
        worker.streaming = False
        worker.owed.clear()
        worker.tasks.forget()
        if self._unsent is not None and self._unsent[0] is worker:
            self._unsent = None
        if self._in_order:
            self._in_flight = collections.deque(
                entry for entry in self._in_flight if entry[1] is not worker)
        if not self._persistent:
            worker.tasks.stop()  # a persistent one waits for the next epoch

    # ------------------------------------------------------------------ failures, the end
    def _lost(self, worker):
        self._stop_workers()
        error = RuntimeError(f"DataLoader worker (pid(s) {worker.pid}) exited unexpectedly")
        if self._start_method == "spawn":
            _note(error, f"The workers were spawned{self._spawn_reason()}: a spawned worker "
                         "imports the main script again, so a script that starts them needs "
                         "the `if __name__ == '__main__':` guard")
        raise error

    def _spawn_reason(self):
        return f" (not forked: {self._why_spawned})" if self._why_spawned else ""

    def _stop_workers(self):
        """Ask every worker to exit, give them a moment, then terminate and reap the rest;
        the iterator is finished."""
        if self._shutdown:
            return
        self._shutdown = True
        processes = [w.process for w in self._workers]
        try:
            for worker in self._workers:
                if worker.process.is_alive():
                    worker.tasks.stop()
        finally:
            join_all(processes, _SHUTDOWN_GRACE)
            reap(processes, _SHUTDOWN_GRACE)
            for worker in self._workers:
                worker.tasks.close()
                worker.results.close()

    def __del__(self):
        if sys is None or sys.is_finalizing():
            return  # interpreter exit: multiprocessing terminates daemonic workers itself
        try:
            self._stop_workers()
        except AttributeError:  # __init__ failed before there was a list of workers
            pass

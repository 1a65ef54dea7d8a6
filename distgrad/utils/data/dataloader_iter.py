"""The iterators a :class:`~distgrad.utils.data.DataLoader` returns: one that makes batches
in this process, and one that has worker processes make them (indices to each worker on
a pipe, batches back through :mod:`.channel`, in order or as they come, failures and
dead workers raised in the parent, workers stopped and reaped at the end)."""
import fcntl
import itertools
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


class _BaseDataLoaderIter:
    def __init__(self, loader):
        self._dataset = loader.dataset
        self._dataset_kind = loader._dataset_kind
        self._IterableDataset_len_called = loader._IterableDataset_len_called
        self._auto_collation = loader._auto_collation
        self._drop_last = loader.drop_last
        self._index_sampler = loader._index_sampler
        self._num_workers = loader.num_workers
        if loader.pin_memory and loader.pin_memory_device:
            warnings.warn("pin_memory_device is deprecated, the current accelerator will be used "
                          f"as the device,ignore pin_memory_device='{loader.pin_memory_device}'.",
                          stacklevel=2)
        if loader.pin_memory and not accelerator.is_available():
            warnings.warn("'pin_memory' argument is set as true but no accelerator is found, then "
                          "device pinned memory won't be used.", stacklevel=2)
        self._timeout = loader.timeout
        self._collate_fn = loader.collate_fn
        self._sampler_iter = iter(self._index_sampler)
        self._base_seed = int(randint(0, 2 ** 62, (), generator=loader.generator).item())
        self._persistent_workers = loader.persistent_workers
        self._num_yielded = 0
        self._shutdown = False

    def __iter__(self):
        return self

    def _reset(self, loader, first_iter=False):
        self._sampler_iter = iter(self._index_sampler)
        self._num_yielded = 0
        self._IterableDataset_len_called = loader._IterableDataset_len_called

    def _next_index(self):
        return next(self._sampler_iter)  # may raise StopIteration

    def _next_data(self):
        raise NotImplementedError

    def __next__(self):
        data = self._next_data()
        self._num_yielded += 1
        if (self._dataset_kind == ITERABLE and self._IterableDataset_len_called is not None
                and self._num_yielded > self._IterableDataset_len_called):
            msg = (f"Length of IterableDataset {self._dataset} was reported to be "
                   f"{self._IterableDataset_len_called}(when accessing len(dataloader)), but "
                   f"{self._num_yielded} samples have been fetched. ")
            if self._num_workers > 0:
                msg += ("For multiprocessing data-loading, this could be caused by not properly "
                        "configuring the IterableDataset replica at each worker.")
            warnings.warn(msg, stacklevel=2)
        return data

    def __len__(self):
        return len(self._index_sampler)

    def __getstate__(self):
        raise NotImplementedError(f"{self.__class__.__name__} cannot be pickled")


class _SingleProcessDataLoaderIter(_BaseDataLoaderIter):
    def __init__(self, loader):
        super().__init__(loader)
        self._dataset_fetcher = create_fetcher(self._dataset_kind, self._dataset,
                                               self._auto_collation, self._collate_fn,
                                               self._drop_last)

    def _next_data(self):
        index = self._next_index()  # may raise StopIteration
        return self._dataset_fetcher.fetch(index)  # may raise StopIteration


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


class _MultiProcessingDataLoaderIter(_BaseDataLoaderIter):
    """Batches from worker processes.

    Task ``k`` (a batch's indices) goes to an active worker, round robin, on that
    worker's index queue; its result comes back on the worker's own result pipe.
    ``_task_info[k]`` is ``(worker,)`` while the task is out and ``(worker, data)``
    once its result arrived ahead of its turn.
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
        self._workers, self._index_pipes, self._result_conns = [], [], []
        self._held = None  # (worker, task index, encoded task) waiting for room in its pipe
        try:
            for i in range(self._num_workers):
                index_reader, index_writer = context.Pipe(duplex=False)
                receiver, sender = context.Pipe(duplex=False)
                w = context.Process(
                    target=worker_loop, daemon=True,
                    args=(self._dataset_kind, self._dataset, index_reader, sender,
                          self._auto_collation, self._collate_fn, self._drop_last,
                          self._base_seed, loader.worker_init_fn, i, self._num_workers,
                          os.getpid()))
                self._index_pipes.append(_IndexPipe(index_writer))
                self._result_conns.append(receiver)
                w.start()
                sender.close()  # the worker holds the only writer: its death ends the pipe
                index_reader.close()
                self._workers.append(w)
        except BaseException as e:
            self._shutdown_workers()
            if self._start_method != "fork" and (
                    isinstance(e, (TypeError, AttributeError))
                    or "pickl" in type(e).__name__.lower()):
                _note(e, f"DataLoader workers start with the {self._start_method!r} method "
                         f"here{self._spawn_reason()}: the dataset, collate_fn and "
                         "worker_init_fn must be picklable (defined at the top level of a "
                         "module)")
            raise
        self._reset(loader, first_iter=True)

    def _reset(self, loader, first_iter=False):
        super()._reset(loader, first_iter)
        self._send_idx = 0
        self._rcvd_idx = 0
        self._task_info = {}
        self._tasks_outstanding = 0
        self._workers_status = [True] * self._num_workers
        self._workers_num_tasks = [0] * self._num_workers
        self._worker_queue_idx_cycle = itertools.cycle(range(self._num_workers))
        if not first_iter:
            # A new epoch of persistent workers: drop what the last one left in flight.
            self._held = None  # the old epoch's: dropped with the rest of it
            for worker_id in range(self._num_workers):
                pipe, resume = self._index_pipes[worker_id], _IndexPipe.encode(RESUME)
                while not pipe.fits(resume):  # its old tasks first: their results are dropped
                    pipe.answered(self._receive(worker_id)[0])
                pipe.send(None, resume)
                while True:
                    idx, kind, _ = self._receive(worker_id)
                    pipe.answered(idx)
                    if kind == channel.RESUMED:
                        break
                pipe.forget()
        for _ in range(self._prefetch_factor * self._num_workers):
            self._try_put_index()

    def _receive(self, worker_id, timeout=None):
        """The next message from ``worker_id``: wait for it (RuntimeError if the worker
        dies or ``timeout`` passes)."""
        conn, worker = self._result_conns[worker_id], self._workers[worker_id]
        if not conn.poll():
            ready = multiprocessing.connection.wait([conn, worker.sentinel], timeout)
            if not ready:
                raise RuntimeError(f"DataLoader timed out after {self._timeout} seconds")
            if conn not in ready and not conn.poll():
                self._worker_died(worker_id)
        try:
            return channel.receive(conn)
        except channel.WorkerDied:
            self._worker_died(worker_id)

    def _worker_died(self, worker_id):
        pid = self._workers[worker_id].pid
        self._shutdown_workers()
        error = RuntimeError(f"DataLoader worker (pid(s) {pid}) exited unexpectedly")
        if self._start_method == "spawn":
            _note(error, f"The workers were spawned{self._spawn_reason()}: a spawned worker "
                         "imports the main script again, so a script that starts them needs "
                         "the `if __name__ == '__main__':` guard")
        raise error

    def _spawn_reason(self):
        return f" (not forked: {self._why_spawned})" if self._why_spawned else ""

    def _get_data(self):
        """``(task index, kind, payload)`` of the next result from any worker with tasks out."""
        busy = [w for w in range(self._num_workers) if self._workers_num_tasks[w] > 0]
        if self._in_order:  # the next result in order can only come from its worker
            busy = [self._task_info[self._rcvd_idx][0]]
        timeout = self._timeout if self._timeout > 0 else None
        for w in busy:
            if self._result_conns[w].poll():
                return w, self._receive(w)
        if len(busy) == 1:
            return busy[0], self._receive(busy[0], timeout)
        waitables = [self._result_conns[w] for w in busy] + [self._workers[w].sentinel
                                                               for w in busy]
        ready = multiprocessing.connection.wait(waitables, timeout)
        if not ready:
            raise RuntimeError(f"DataLoader timed out after {self._timeout} seconds")
        for w in busy:
            if self._result_conns[w] in ready or self._workers[w].sentinel in ready:
                return w, self._receive(w, timeout)
        raise AssertionError("wait() returned nothing that was waited for")

    def _next_data(self):
        while True:
            # Skip tasks that went to a worker whose stream has ended.
            while self._rcvd_idx < self._send_idx:
                info = self._task_info.get(self._rcvd_idx)
                if info and (len(info) == 2 or self._workers_status[info[0]]):
                    break
                self._task_info.pop(self._rcvd_idx, None)
                self._rcvd_idx += 1
            else:
                if not self._persistent_workers:
                    self._shutdown_workers()
                raise StopIteration
            if self._shutdown:
                raise StopIteration
            self._flush_held()
            if len(self._task_info[self._rcvd_idx]) == 2:
                worker_id, result = self._task_info.pop(self._rcvd_idx)
                self._rcvd_idx += 1
                return self._process_data(result, worker_id)
            worker_id, (idx, kind, payload) = self._get_data()
            self._index_pipes[worker_id].answered(idx)
            if kind == channel.RESUMED:
                continue  # a stale acknowledgement
            self._tasks_outstanding -= 1
            if kind == channel.END:
                self._workers_num_tasks[worker_id] -= 1
                self._task_info.pop(idx, None)
                self._mark_worker_as_unavailable(worker_id)
                self._try_put_index()
                continue
            if idx != self._rcvd_idx:
                if not self._in_order:
                    self._task_info.pop(idx)
                    return self._process_data((kind, payload), worker_id)
                self._task_info[idx] += ((kind, payload),)
            else:
                self._task_info.pop(idx)
                self._rcvd_idx += 1
                return self._process_data((kind, payload), worker_id)

    def _flush_held(self):
        """Send the held task once its worker's pipe has room for it."""
        if self._held is not None:
            worker_id, idx, data = self._held
            if self._index_pipes[worker_id].fits(data):
                self._held = None
                self._index_pipes[worker_id].send(idx, data)

    def _try_put_index(self):
        self._flush_held()
        if self._held is not None:
            return  # tasks go out in order: the next one waits behind the held one
        max_tasks = self._prefetch_factor * self._num_workers
        try:
            index = self._next_index()
        except StopIteration:
            return
        for _ in range(self._num_workers):  # the next active worker, if any
            worker_queue_idx = next(self._worker_queue_idx_cycle)
            if self._workers_status[worker_queue_idx]:
                if self._in_order or (self._workers_num_tasks[worker_queue_idx]
                                      < max_tasks // sum(self._workers_status)):
                    break
        else:
            return
        pipe = self._index_pipes[worker_queue_idx]
        data = pipe.encode((self._send_idx, index))
        if pipe.fits(data):
            pipe.send(self._send_idx, data)
        else:
            self._held = (worker_queue_idx, self._send_idx, data)
        self._task_info[self._send_idx] = (worker_queue_idx,)
        self._workers_num_tasks[worker_queue_idx] += 1
        self._tasks_outstanding += 1
        self._send_idx += 1

    def _process_data(self, result, worker_id):
        self._workers_num_tasks[worker_id] -= 1
        self._try_put_index()
        kind, payload = result
        if kind == channel.ERROR:
            channel.raise_exception(payload)
        return payload

    def _mark_worker_as_unavailable(self, worker_id):
        # A persistent worker waits for the next epoch; any other one may exit now.
        if not self._persistent_workers:
            self._index_pipes[worker_id].stop()
        self._workers_status[worker_id] = False

    def _shutdown_workers(self):
        """Tell every worker to stop, give them a moment, then terminate and reap them."""
        if self._shutdown:
            return
        self._shutdown = True
        try:
            for pipe, w in zip(self._index_pipes, self._workers):
                if w.is_alive():
                    pipe.stop()
        finally:
            join_all(self._workers, _SHUTDOWN_GRACE)
            reap(self._workers, _SHUTDOWN_GRACE)
            for pipe in self._index_pipes:
                pipe.close()
            for conn in self._result_conns:
                conn.close()

    def __del__(self):
        if sys is None or sys.is_finalizing():
            return  # interpreter exit: multiprocessing terminates daemonic workers itself
        try:
            self._shutdown_workers()
        except AttributeError:  # __init__ failed before the worker lists existed
            pass

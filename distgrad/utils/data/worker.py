"""What runs inside a DataLoader worker process, and ``get_worker_info``.

A worker gets its copy of the dataset, the collate function and
``worker_init_fn`` when it starts (inherited by a forked worker, pickled by
:mod:`multiprocessing` into a spawned one; see :mod:`distgrad.multiprocessing`).
Then it takes tasks ``(task index, indices)`` from its index pipe, fetches and
collates the batch, and writes it to its result pipe (:mod:`.channel`) until
told to stop, or until the parent is gone (SIGKILL from the kernel on Linux;
a ``getppid`` check elsewhere).
"""
import os
import random
from dataclasses import dataclass

import numpy as np

from ..processes import die_with_parent
from . import channel
from .fetch import ITERABLE, create_fetcher

__all__ = ["WorkerInfo", "get_worker_info"]

# How long a worker waits for a task before it checks that its parent is alive.
STATUS_CHECK_INTERVAL = 5.0

RESUME = "resume"  # index-pipe message of persistent workers: start a new epoch

_worker_info = None


@dataclass(frozen=True)
class WorkerInfo:
    """The current worker: ``id`` (0 .. num_workers - 1), ``num_workers``, the ``seed``
    its generators got, and its own copy of the ``dataset``."""
    id: int
    num_workers: int
    seed: int
    dataset: object


def get_worker_info():
    """The :class:`WorkerInfo` of this DataLoader worker process; ``None`` in the main process.

    Use it in an ``IterableDataset.__iter__`` or a ``worker_init_fn`` to give each
    worker its share of the data.
    """
    return _worker_info


def _seed_everything(base_seed, worker_id):
    """Seed Python's, distgrad's and NumPy's global generators differently in each worker."""
    from ...ops.creation import manual_seed
    seed = base_seed + worker_id
    random.seed(seed)
    manual_seed(seed)
    # NumPy's legacy seeding takes 32-bit words: mix the pair so that neighbouring
    # workers and base seeds do not get correlated streams.
    np.random.seed(np.random.SeedSequence([worker_id, base_seed]).generate_state(4))
    return seed


def worker_loop(dataset_kind, dataset, index_pipe, result_conn, auto_collation, collate_fn,
                drop_last, base_seed, init_fn, worker_id, num_workers, parent_pid):
    """The worker process's entry point (``multiprocessing.Process`` target)."""
    die_with_parent(parent_pid)
    global _worker_info
    where = f"in DataLoader worker process {worker_id}"
    try:
        seed = _seed_everything(base_seed, worker_id)
        _worker_info = WorkerInfo(id=worker_id, num_workers=num_workers, seed=seed,
                                  dataset=dataset)
        init_error = None
        try:
            if init_fn is not None:
                init_fn(worker_id)
            fetcher = create_fetcher(dataset_kind, dataset, auto_collation, collate_fn, drop_last)
        except Exception:
            init_error = channel.capture_exception(where)  # reported as each task's result
        iteration_end = False
        while True:
            try:
                if not index_pipe.poll(STATUS_CHECK_INTERVAL):
                    if os.getppid() != parent_pid:
                        break
                    continue
                message = index_pipe.recv()
            except EOFError:  # the parent closed its end: it is done with us, or gone
                break
            if message is None:
                break
            if message == RESUME:
                iteration_end = False
                if init_error is None:
                    fetcher = create_fetcher(dataset_kind, dataset, auto_collation, collate_fn,
                                             drop_last)
                channel.send(result_conn, None, channel.RESUMED)
                continue
            if iteration_end:
                continue  # the stream has ended; the parent knows and stops asking
            task_idx, index = message
            if init_error is not None:  # every batch fails as the first one did
                channel.send(result_conn, task_idx, channel.ERROR, init_error)
                continue
            try:
                batch = fetcher.fetch(index)
            except StopIteration:
                if dataset_kind != ITERABLE:
                    channel.send(result_conn, task_idx, channel.ERROR,
                                 channel.capture_exception(where))
                    continue
                iteration_end = True
                channel.send(result_conn, task_idx, channel.END, worker_id)
                continue
            except Exception:
                channel.send(result_conn, task_idx, channel.ERROR,
                             channel.capture_exception(where))
                continue
            _send_batch(result_conn, task_idx, batch, where)
            del batch, index, message
    except (KeyboardInterrupt, BrokenPipeError):
        pass  # the parent is shutting us down, or is gone


def _send_batch(conn, task_idx, batch, where):
    try:
        channel.send(conn, task_idx, channel.DATA, batch)
    except (TypeError, ValueError) as e:  # CodecError is a ValueError
        try:
            raise TypeError(f"the batch cannot be sent to the main process: {e}. DataLoader "
                            "workers send batches without pickling: return tensors, NumPy "
                            "arrays, numbers, strings, or lists, tuples, dicts and namedtuples "
                            "of them (or use num_workers=0)") from e
        except TypeError:
            channel.send(conn, task_idx, channel.ERROR, channel.capture_exception(where))

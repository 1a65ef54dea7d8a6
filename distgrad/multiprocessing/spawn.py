"""``spawn`` and ``start_processes`` with ``torch.multiprocessing``'s signatures and errors.

``spawn(fn, args, nprocs)`` starts ``nprocs`` processes that each run
``fn(i, *args)``. With ``join=True`` it waits for all of them; when one fails
the others are terminated (SIGTERM, then SIGKILL after a grace period) and
the parent raises :class:`ProcessRaisedException`, carrying the child's
traceback, or :class:`ProcessExitedException` for a child that died by a
signal or exited non-zero. With ``join=False`` it returns a
:class:`ProcessContext` whose ``join(timeout)`` does the same step by step.

A failing child writes its traceback as UTF-8 text to a file in a temp
directory owned by the parent (removed when the context is done, swept if the
parent crashes); the parent reads it back as text. Nothing a child produces
is unpickled by the parent.

The children get a world secret (``DISTGRAD_WORLD_SECRET``) from their parent, which
makes one unless it has one already: a world they form with ``init_rpc`` or
``init_process_group`` admits only them (``utils/world_secret.py``).
"""
import logging
import multiprocessing
import multiprocessing.connection
import os
import signal
import sys
import warnings
import weakref

from ..utils.tempdirs import owned_tempdir
from ..utils.world_secret import SECRET_ENV, for_children
from ..utils.processes import die_with_parent, join_all, reap

__all__ = ["ProcessContext", "ProcessException", "ProcessExitedException",
           "ProcessRaisedException", "spawn", "start_processes"]

log = logging.getLogger(__name__)


class ProcessException(Exception):
    """A spawned process failed; ``error_index`` is its index, ``error_pid`` its pid."""

    def __init__(self, msg, error_index, error_pid):
        super().__init__(msg)
        self.msg = msg
        self.error_index = error_index
        self.error_pid = error_pid

    def __reduce__(self):
        return type(self), (self.msg, self.error_index, self.error_pid)


class ProcessRaisedException(ProcessException):
    """A spawned process raised an exception; the message holds its traceback."""


class ProcessExitedException(ProcessException):
    """A spawned process died by a signal or exited with a non-zero code."""

    def __init__(self, msg, error_index, error_pid, exit_code, signal_name=None):
        super().__init__(msg, error_index, error_pid)
        self.exit_code = exit_code
        self.signal_name = signal_name

    def __reduce__(self):
        return (type(self), (self.msg, self.error_index, self.error_pid, self.exit_code,
                             self.signal_name))


def _wrap(fn, i, args, error_file, parent_pid, secret=None):
    """The child's entry point: run ``fn(i, *args)``, report an exception as text.
    ``secret``: the world secret its parent hands it (see ``utils/world_secret.py``)."""
    die_with_parent(parent_pid)
    if secret is not None:
        os.environ.setdefault(SECRET_ENV, secret)
    try:
        fn(i, *args)
    except KeyboardInterrupt:
        pass  # the parent interrupted us on purpose
    except Exception:
        import traceback
        with open(error_file, "w", encoding="utf-8", errors="replace") as fh:
            fh.write(traceback.format_exc())
        sys.exit(1)


class ProcessContext:
    """The processes started by :func:`start_processes`, and waiting for them."""

    def __init__(self, processes, error_files):
        self.error_files = error_files
        self.processes = processes
        self.sentinels = {process.sentinel: index for index, process in enumerate(processes)}

    def pids(self):
        return [int(process.pid) for process in self.processes]

    def join(self, timeout=None, grace_period=None):
        """Wait for any process to fail or all to finish, at most ``timeout`` seconds.

        Returns ``True`` when every process has exited successfully, ``False``
        while some still run. When one has failed, the others get
        ``grace_period`` seconds (none by default) to exit, then SIGTERM, then
        after another grace period (30 s by default) SIGKILL, and the failure is
        raised as :class:`ProcessRaisedException` or
        :class:`ProcessExitedException`.
        """
        if not self.sentinels:
            return True
        ready = multiprocessing.connection.wait(self.sentinels.keys(), timeout=timeout)
        error_index = None
        for sentinel in ready:
            index = self.sentinels.pop(sentinel)
            process = self.processes[index]
            process.join()
            if process.exitcode != 0:
                error_index = index
                break
        if error_index is None:
            if not self.sentinels:
                self._remove_error_files()
            return not self.sentinels
        if grace_period is not None:  # let the others notice and exit on their own first
            join_all(self.processes, grace_period)
        self.terminate(30.0 if grace_period is None else grace_period)
        raise self._failure(error_index)

    def terminate(self, grace_period=30.0):
        """SIGTERM every live process, SIGKILL those still alive after ``grace_period``
        seconds, and join them all."""
        for process in self.processes:
            if process.is_alive():
                log.warning("Terminating process %s via signal SIGTERM", process.pid)
        reap(self.processes, grace_period)
        self.sentinels.clear()

    def _failure(self, error_index):
        failed = self.processes[error_index]
        try:
            with open(self.error_files[error_index], encoding="utf-8", errors="replace") as fh:
                original_trace = fh.read()
        except OSError:
            original_trace = None
        finally:
            self._remove_error_files()
        if original_trace is None:
            exitcode = failed.exitcode
            if exitcode < 0:
                try:
                    name = signal.Signals(-exitcode).name
                except ValueError:
                    name = f"<Unknown signal {-exitcode}>"
                return ProcessExitedException(
                    f"process {error_index:d} terminated with signal {name}",
                    error_index=error_index, error_pid=failed.pid, exit_code=exitcode,
                    signal_name=name)
            return ProcessExitedException(
                f"process {error_index:d} terminated with exit code {exitcode:d}",
                error_index=error_index, error_pid=failed.pid, exit_code=exitcode)
        msg = f"\n\n-- Process {error_index:d} terminated with the following error:\n"
        return ProcessRaisedException(msg + original_trace, error_index, failed.pid)

    def _remove_error_files(self):
        _remove_files(self.error_files)


def _remove_files(paths, directory=None):
    """Remove the error files and their directory (only if empty: it may not be ours alone)."""
    for path in paths:
        try:
            os.unlink(path)
        except OSError:
            pass
    for directory in {os.path.dirname(path) for path in paths} | ({directory} - {None}):
        try:
            os.rmdir(directory)
        except OSError:
            pass


def start_processes(fn, args=(), nprocs=1, join=True, daemon=False, start_method="spawn"):
    """:func:`spawn` with any start method of :mod:`multiprocessing`."""
    mp = multiprocessing.get_context(start_method)
    error_dir = owned_tempdir("distgrad-spawn-")
    error_files = [os.path.join(error_dir, f"process-{i}.traceback") for i in range(nprocs)]
    processes = []
    context = ProcessContext(processes, error_files)
    cleanup = weakref.finalize(context, _remove_files, list(error_files), error_dir)
    # the children form a world (as a torchrun agent's do): its secret, made here
    secret = for_children()
    try:
        for i in range(nprocs):
            process = mp.Process(target=_wrap, args=(fn, i, args, error_files[i], os.getpid(),
                                                     secret), daemon=daemon)
            # known before it starts: an interrupt right after start() must still reach it
            # (else the interpreter's exit joins it as a non-daemon child, for as long as
            # it runs)
            processes.append(process)
            process.start()
            context.sentinels[process.sentinel] = i
        if not join:
            return context
        while not context.join():
            pass
    except BaseException:
        # A child's failure has already been reaped by join; an interrupt, or a
        # process that could not be started, leaves the others to end here.
        context.terminate()
        cleanup()
        raise
    cleanup()
    return None


def spawn(fn, args=(), nprocs=1, join=True, daemon=False, start_method="spawn"):
    """Start ``nprocs`` processes running ``fn(i, *args)`` with the ``spawn`` start method.

    ``fn`` must be importable by name (defined at the top level of a module),
    since the child imports it. Returns ``None`` when ``join`` is true, else a
    :class:`ProcessContext`. If a process fails, the rest are terminated and
    the failure is raised with the child's traceback.

    Example (a complete program: ``scripts/example_distributed.py``)::

        import distgrad.multiprocessing as mp

        def run(rank, world_size):
            print(f"process {rank} of {world_size}")

        if __name__ == "__main__":
            mp.spawn(run, args=(2,), nprocs=2)
    """
    if start_method != "spawn":
        warnings.warn(f"This method only supports start_method=spawn (got: {start_method}).\n"
                      "To use a different start_method use:\n\t\t"
                      " torch.multiprocessing.start_processes(...)", FutureWarning, stacklevel=2)
    return start_processes(fn, args, nprocs, join, daemon, start_method="spawn")

"""``distgrad.multiprocessing``: Python's :mod:`multiprocessing` plus PyTorch's ``spawn``.

As ``torch.multiprocessing`` does, this module re-exports everything of
:mod:`multiprocessing` (``Process``, ``Queue``, ``Pipe``, ``get_context``,
``set_start_method``, ``cpu_count``, ...) and adds :func:`spawn`,
:func:`start_processes`, :class:`ProcessContext` and the exceptions
:class:`ProcessRaisedException` / :class:`ProcessExitedException`.

Every child started here calls :func:`distgrad.utils.processes.die_with_parent` first, so it
gets SIGKILL when its parent exits (Linux), and a failure or an interrupt in
the parent terminates, then kills, the children it started.

Tensors cross into the children as PyTorch's do: pickled by :mod:`multiprocessing`
(a spawned child's arguments, a ``Queue``), a tensor is moved into shared memory
and travels as a handle to it, so both processes use one buffer; a forked child
inherits what was shared before the fork (see :mod:`.sharing`;
``Module.share_memory()`` shares a model's parameters for the Hogwild pattern).

On pickling. ``spawn(fn, args)`` hands ``fn`` and ``args`` to the child the way
the standard library hands any ``Process`` target to a spawned child: the
parent pickles them into a private pipe to a process it has just created,
running its own code, and the child unpickles them. Nothing there arrives from
a peer over a socket, and a program that trusted its own arguments before the
spawn trusts the same bytes after it, so distgrad keeps this path (and with it
unchanged PyTorch programs). The other direction is where distgrad differs
from PyTorch: what a child sends back to its parent (a traceback, a DataLoader
batch) is never unpickled there; tracebacks come back as text, batches through
:mod:`distgrad.codec`.

>>> import distgrad.multiprocessing as mp
>>> mp.get_start_method(allow_none=True) in (None, "spawn", "fork", "forkserver")
True
"""
import multiprocessing
import sys
from multiprocessing import *  # noqa: F401,F403 - torch.multiprocessing re-exports it all

from . import sharing  # noqa: F401 - shared memory; the methods are distgrad.Tensor's
from .spawn import (ProcessContext, ProcessExitedException, ProcessRaisedException, spawn,
                    start_processes)

__all__ = ["set_sharing_strategy", "get_sharing_strategy", "get_all_sharing_strategies",
           "ProcessContext", "ProcessExitedException",
           "ProcessRaisedException", "spawn", "start_processes"] + multiprocessing.__all__

# Shared tensors always travel as file descriptors of anonymous memory files (PyTorch's
# "file_descriptor" way; see sharing.py), which leave nothing behind in /dev/shm. Programs
# may still choose "file_system", PyTorch's way around descriptor limits: it is recorded
# and reported, and tensors travel as before.
_sharing_strategy = "file_system" if sys.platform in ("darwin", "win32") else "file_descriptor"
_all_sharing_strategies = ({"file_system"} if sys.platform in ("darwin", "win32")
                           else {"file_descriptor", "file_system"})


def set_sharing_strategy(new_strategy):
    global _sharing_strategy
    if new_strategy not in _all_sharing_strategies:
        raise AssertionError(f"invalid sharing strategy {new_strategy!r}, "
                             f"expected one of {_all_sharing_strategies}")
    _sharing_strategy = new_strategy


def get_sharing_strategy():
    return _sharing_strategy


def get_all_sharing_strategies():
    return _all_sharing_strategies

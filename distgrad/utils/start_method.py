"""Which start method helper processes (DataLoader workers) get when the program names none.

PyTorch's DataLoader starts its workers with :mod:`multiprocessing`'s default method:
``fork`` on Linux, so a script without an ``if __name__ == "__main__":`` guard works
there (a forked child does not import the script again; a spawned one does, and starts
the script's own DataLoader anew). distgrad does the same, except where forking would
be unsafe: the child of ``fork`` is a copy of the forking thread alone, so

* a lock another thread held at that moment stays held in the child forever, and
* a ZeroMQ context (its I/O threads, its sockets) is copied half-alive into a process
  that must never use or close it.

So ``fork`` is used only while this is the process's only Python thread and no
ZeroMQ I/O thread runs in it (a live context has one: Linux names it ``ZMQbg/...``).
Then the child holds no lock that nobody will release and no ZeroMQ state; what else
runs natively (a BLAS thread pool) is made fork-safe by its library
(``pthread_atfork``). Otherwise, and where ``fork`` is not the default, the start
method is ``spawn`` (and a script that starts workers then needs the guard, as on
macOS and Windows with PyTorch). A ``spawn`` or ``forkserver`` the program chose
with ``set_start_method`` is used as it is; ``fork`` is the default on Linux, and
:mod:`multiprocessing` cannot tell a program's ``set_start_method("fork")`` from the
default it fixes on first use (an ``mp.Queue()`` does), so it is used only when safe
as well. ``multiprocessing_context="fork"`` on the DataLoader forks regardless.

>>> import multiprocessing
>>> default_context().get_start_method() in ("fork", "spawn", "forkserver")
True
"""
import multiprocessing
import os
import sys
import threading

__all__ = ["fork_hazards", "default_context"]


def _zmq_io_threads():
    """Names of the ZeroMQ I/O threads of this process (Linux names them ``ZMQbg/...``, from
    inside the new thread: a context made a moment ago may not show yet, so pyzmq's shared
    context, the one distgrad's stores use, counts too)."""
    zmq = sys.modules.get("zmq")
    instance = getattr(getattr(zmq, "Context", None), "_instance", None)
    names = ["pyzmq's shared context"] if instance is not None and not instance.closed else []
    try:
        tasks = os.listdir("/proc/self/task")
    except OSError:  # no /proc: the shared context is all we can see
        return names
    for tid in tasks:
        try:
            with open(f"/proc/self/task/{tid}/comm") as fh:
                name = fh.read().strip()
        except OSError:  # the thread ended meanwhile
            continue
        if name.startswith("ZMQbg"):
            names.append(name)
    return names


def fork_hazards():
    """What makes forking this process unsafe right now (empty when nothing does)."""
    hazards = []
    others = [t.name for t in threading.enumerate() if t is not threading.current_thread()]
    if others:
        hazards.append(f"other threads are running ({', '.join(sorted(others)[:5])})")
    zmq = _zmq_io_threads()
    if zmq:
        hazards.append(f"a ZeroMQ context is alive ({len(zmq)} I/O threads)")
    return hazards


def default_context():
    """The context to start helper processes with when the program named none (see the
    module's doc): the chosen or default method, with ``spawn`` for an unsafe ``fork``."""
    method = multiprocessing.get_start_method(allow_none=True)
    if method is None:
        # the first is the platform's default; asking the default context instead would
        # fix the program's start method for good (set_start_method would then refuse)
        method = multiprocessing.get_all_start_methods()[0]
    if method == "fork" and fork_hazards():
        method = "spawn"
    return multiprocessing.get_context(method)

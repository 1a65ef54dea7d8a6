"""Leak checks: what a test left behind in the processes of its world.

The state of a process (:func:`process_state`: its threads, file descriptors, child
processes, and RPC state: RRef values it owns, calls it waits for, distributed
autograd contexts, interceptors) is taken when a world starts and again when its
test ends; :func:`differences` says, in sentences that name the thing, what is new.
:func:`owned_paths` finds the ipc directories, shared-memory segments and temp
files that distgrad names after their owner's pid (``dg-rpc-<pid>-...``,
``dgshm-<pid>-...``, see ``distgrad/utils/tempdirs.py``).

Two strengths of comparison: ``strict`` (this process after its world closed: every
new thread, descriptor and child is a leak) and not strict (a process whose RPC
agent still runs, such as a worker or a shared world: its handler pool grows on
demand and every thread that made a blocking call keeps its own sockets, so only
new files, pipes and non-RPC threads count there).
"""
import collections
import gc
import os
import re
import sys
import tempfile
import threading

__all__ = ["process_state", "differences", "new_children", "owned_paths", "children",
           "start_process_helpers"]

_OWNED = re.compile(r"^(?:dg|distgrad)[a-z_-]*?-(\d+)-")
_RPC_THREAD = "rpc-"


def process_state(collect=False):
    """This process's state (plain data, so a worker can send it); ``collect`` runs the
    garbage collector first, so RRefs and contexts held only by cycles are released."""
    if collect:
        gc.collect()
    helper = _zmq_garbage_thread()
    return {"pid": os.getpid(),
            "threads": sorted(t.name for t in threading.enumerate()
                              if t.is_alive() and t is not helper),
            "fds": _fds(), "children": children(os.getpid()), **rpc_state()}


def _zmq_garbage_thread():
    """pyzmq's garbage-collector thread: started by the first zero-copy send of a process,
    and kept for the process's life (not a test's leftover)."""
    garbage = sys.modules.get("zmq.utils.garbage")
    return getattr(getattr(garbage, "gc", None), "thread", None)


def start_process_helpers():
    """Start now what a process starts on first use and keeps (pyzmq's garbage collector,
    its thread, context and socket), so that a test that first uses it leaks nothing."""
    from zmq.utils import garbage
    try:
        if not garbage.gc.is_alive():
            garbage.gc.start()
        garbage.gc._push_socket  # noqa: B018 - created on first use: create it now
    except (AttributeError, RuntimeError):  # another pyzmq, or interpreter shutdown
        pass


def rpc_state():
    """RRef values owned here, calls waiting for a reply, live autograd contexts, and
    interceptors that are not distgrad's own."""
    from distgrad.rpc import current_agent, interceptors
    out = {"rrefs": 0, "pending": 0, "pending_text": "", "contexts": [], "interceptors": []}
    agent = current_agent()
    if agent is not None and agent.running:
        out["rrefs"] = len(agent.owner)
        out["pending"], out["pending_text"] = _user_calls(agent.calls.describe(limit=64))
    container = sys.modules.get("distgrad.distributed.autograd.container")
    live = getattr(container, "live_context_ids", None)  # None while another thread imports it
    if live is not None:
        out["contexts"] = [str(c) for c in live()]
    out["interceptors"] = [name for name, ic in interceptors.installed()
                           if not type(ic).__module__.startswith("distgrad.")]
    return out


def _user_calls(described):
    """(count, text) of the pending calls in ``PendingCalls.describe()``'s text
    ("2 x mod:fn to rank 1, 1 x @barrier to rank 0") that are not the RPC layer's own
    operations (a worker waits in the shutdown barrier for its whole life)."""
    groups = [g for g in described.split(", ") if g and " x @" not in g]
    count = 0
    for g in groups:
        head = g.split(" x ", 1)[0]
        count += int(head) if head.isdigit() else 1
    return count, ", ".join(groups)


def _fds():
    try:
        names = os.listdir("/proc/self/fd")
    except OSError:  # not Linux: no descriptor check
        return {}
    out = {}
    for n in names:
        try:
            out[n] = os.readlink(f"/proc/self/fd/{n}")
        except OSError:  # the listing's own descriptor, closed by now
            pass
    return out


def children(pid):
    """{pid: what it runs} of the running child processes of ``pid`` (one that exited and
    is only waiting to be reaped holds nothing but its pid: Python's subprocess reaps a
    forgotten Popen's at its next start)."""
    found = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return {}
    for tid in tasks:
        try:
            with open(f"/proc/{pid}/task/{tid}/children") as f:
                found += f.read().split()
        except OSError:
            pass
    running = {c: _command_line(c) for c in found}
    return {c: cmd for c, cmd in running.items() if cmd is not None}


def _command_line(pid):
    """What process ``pid`` runs; None once it has exited."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            if f.read().rpartition(")")[2].split()[0] in ("Z", "X"):
                return None
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace").strip()[:200]
    except OSError:
        return None


def _file_or_pipe(target):
    return (target.startswith("/") and not target.startswith(("/dev/", "/proc/"))) \
        or target.startswith("pipe:")


def differences(where, before, after, strict, ignore_fds=(), ignore_children=()):
    """Sentences naming what ``after`` (a :func:`process_state`) holds that ``before``
    did not, in the process called ``where``."""
    out = []
    new_threads = collections.Counter(after["threads"]) - collections.Counter(before["threads"])
    for name, k in sorted(new_threads.items()):
        if strict or not name.startswith(_RPC_THREAD):
            out.append(f"{where}: thread {name!r} is still running" + (f" ({k} of them)" if k > 1
                                                                        else ""))
    for pid in new_children(before, after, ignore_children):
        out.append(f"{where}: child process {pid} ({after['children'][str(pid)]}) is still "
                   "there (killed now)")
    for fd, target in sorted(after["fds"].items(), key=lambda kv: int(kv[0])):
        if before["fds"].get(fd) == target or int(fd) in ignore_fds:
            continue
        if strict or _file_or_pipe(target):
            out.append(f"{where}: file descriptor {fd} ({target}) is still open")
    if after["rrefs"] > before["rrefs"]:
        out.append(f"{where}: still owns {after['rrefs']} RRef value(s) (an RRef to them is "
                   "alive somewhere, or its deletion was lost)")
    if after["pending"] > before["pending"]:
        out.append(f"{where}: still waits for {after['pending']} call(s): "
                   f"{after['pending_text']}")
    new_contexts = sorted(set(after["contexts"]) - set(before["contexts"]))
    if new_contexts:
        out.append(f"{where}: distributed autograd context(s) {', '.join(new_contexts)} "
                   "are still alive")
    for name in sorted(set(after["interceptors"]) - set(before["interceptors"])):
        out.append(f"{where}: RPC interceptor {name!r} is still installed")
    return out


def new_children(before, after, ignore=()):
    """Pids of the child processes in ``after`` that ``before`` did not have."""
    return [int(p) for p in after["children"] if p not in before["children"]
            and int(p) not in ignore]


def owned_paths(pids):
    """Paths in the temp dir and /dev/shm that distgrad named after one of ``pids``."""
    pids = {int(p) for p in pids}
    roots = dict.fromkeys(r for r in (tempfile.gettempdir(), "/tmp", "/dev/shm")
                          if os.path.isdir(r))
    out = []
    for root in roots:
        try:
            names = os.listdir(root)
        except OSError:
            continue
        for name in names:
            m = _OWNED.match(name)
            if m and int(m.group(1)) in pids:
                out.append(os.path.join(root, name))
    return sorted(out)

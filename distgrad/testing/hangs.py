"""Hang reports: what every rank of a world is doing, collected before the world is killed.

A World's workers print every thread's stack (faulthandler, so a thread stuck in C
shows too) and their pending calls when they get SIGUSR1 (``distgrad worker
--dump-signal``), into their logs; this process formats its own threads and
pending calls. :class:`Watchdog` takes the report shortly before a test's timeout
(pytest-timeout's), so that it reaches the test's report whether pytest-timeout
then fails the test (signal method) or ends the process (thread method).
"""
import re
import sys
import threading
import time
import traceback

from distgrad.worker import DUMP_END

__all__ = ["this_process", "dump_workers", "report", "without_dumps", "Watchdog"]


_DUMP = re.compile(r"(?ms)^(?:Current thread|Thread) 0x[0-9a-f]+ \(most recent call first\):"
                   r".*?^" + re.escape(DUMP_END) + r"\n?")


def without_dumps(log):
    """A worker's log with its stack dumps replaced by a note (they are in the hang report)."""
    return _DUMP.sub("(stacks and pending calls: see the hang report)\n", log)


def this_process():
    """Pending calls and every thread's stack of this process (rank 0)."""
    from distgrad.rpc import current_agent
    agent = current_agent()
    calls = (agent.calls.describe() or "none") if agent is not None else "(no RPC agent)"
    lines = [f"pending calls: {calls}"]
    names = {t.ident: t.name for t in threading.enumerate()}
    me = threading.get_ident()
    for ident, frame in sys._current_frames().items():
        if ident == me:
            continue  # the thread writing this report
        stack = [f for f in traceback.extract_stack(frame) if not _runner_frame(f.filename)]
        lines.append(f"Thread {names.get(ident, ident)!r} (most recent call last):")
        lines.append("".join(traceback.format_list(stack)).rstrip())
    return "\n".join(lines)


def _runner_frame(filename):
    """pytest's and pluggy's own frames, which every test's main thread starts with."""
    return filename.startswith("<frozen") or any(
        part in filename for part in ("/_pytest/", "/pluggy/", "/pytest/__main__"))


def dump_workers(world, names=None, timeout=2.0):
    """{name: stacks and pending calls} of the live workers ``names`` (all if None)."""
    from .world import DUMP_SIGNAL
    names = [n for n in (names or world.names[1:]) if world.alive(n)]
    out, offsets = {}, {}
    for n in names:
        if n in world.paused:
            out[n] = "(paused with SIGSTOP: it cannot print its stacks)"
            continue
        offsets[n] = world.log_size(n)
        world.signal(n, DUMP_SIGNAL)
    deadline = time.monotonic() + timeout
    while offsets:
        for n, start in list(offsets.items()):
            text = world.log_text(n, start)
            if DUMP_END in text:
                out[n] = text[:text.index(DUMP_END)].rstrip()
                del offsets[n]
        if not offsets or time.monotonic() > deadline:
            break
        time.sleep(0.02)
    for n, start in offsets.items():
        out[n] = (world.log_text(n, start).rstrip()
                  + f"\n(the dump did not complete within {timeout:g} s)")
    # In rank order, not the order the dumps completed in (an idle worker finishes first).
    return {n: _name_threads(out[n]) for n in names}


def _name_threads(dump):
    """faulthandler names threads by id only: add the names the worker listed after."""
    m = re.search(r"^threads of \S+: (.*)\n", dump, re.M)
    if m is None:
        return dump
    names = dict(p.split(" ", 1) for p in m.group(1).split(", ") if " " in p)
    dump = dump[:m.start()] + dump[m.end():]
    return re.sub(r"^(Current thread|Thread) (0x[0-9a-f]+)",
                  lambda t: f"{t.group(1)} {t.group(2)} {names.get(t.group(2), '')}".rstrip(),
                  dump, flags=re.M)


def report(worlds, names=None):
    """The text of a hang report for ``worlds``: rank 0, then every worker (or ``names``)."""
    parts = []
    for world in worlds:
        if world.closed:
            continue
        pids = world.pids()
        parts.append(f"----- rank 0 ({world.names[0]}, pid {pids[world.names[0]]}, "
                     f"the test process) -----\n{this_process()}")
        for name, text in dump_workers(world, names).items():
            rank = world.names.index(name)
            parts.append(f"----- rank {rank} ({name}, pid {pids[name]}) -----\n{text}")
    return "\n\n".join(parts)


class Watchdog:
    """Calls ``on_report(text)`` with :func:`report` of ``worlds()`` after ``delay`` s,
    unless cancelled first."""

    def __init__(self, delay, worlds, on_report):
        self.worlds, self.on_report = worlds, on_report
        self.fired = False
        self._timer = threading.Timer(max(0.0, delay), self._fire)
        self._timer.name = "distgrad-hang-watchdog"
        self._timer.daemon = True
        self._timer.start()

    def _fire(self):
        self.fired = True
        try:
            text = report(self.worlds())
        except Exception as e:  # noqa: BLE001 - a report about the report
            text = f"(the hang report failed: {type(e).__name__}: {e})"
        self.on_report(text)

    def cancel(self):
        self._timer.cancel()
        if self._timer is not threading.current_thread():
            self._timer.join()

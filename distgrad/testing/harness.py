"""The worlds of one test, from start to leak check, and the worlds tests share.

:class:`TestWorlds` is what the pytest plugin keeps per test: it opens worlds (a
new one, or a shared one), takes each process's state when the test gets its
world, and when the test ends checks that nothing was left behind (``leaks.py``)
before and after closing the world; a hang watchdog runs meanwhile
(``hangs.py``). :class:`Registry` keeps the worlds shared by a module or the
session: one RPC agent per process, so opening another world closes them, and
each test must leave a shared world as it found it (else the test fails and the
world is replaced).
"""
import gc
import os
import signal
import time

from distgrad.utils.tempdirs import remove_path

from . import forkserver, hangs, leaks
from .world import World

__all__ = ["TestWorlds", "Registry", "LEAK_HINT"]

LEAK_HINT = "(mark the test no_leak_check, or pass leak_check=False, to skip this check)"


class _Opened:
    """A world as one test uses it."""

    def __init__(self, world, key, leak_check):
        self.world, self.key, self.leak_check = world, key, leak_check
        self.rank0_before = None    # this process before a new world started (strict check)
        self.paths_before = set()
        self.baseline = {}          # name -> process state when the test got the world
        self.log_offsets = {}


class Registry:
    """The worlds shared by modules or the session (one per key), and what tests trust."""

    def __init__(self, session_modules=None):
        self.shared = {}          # key -> World
        self.session_modules = dict(session_modules or {})

    def take(self, key):
        """The shared world of ``key`` if it still serves; every other world is closed (this
        process has one RPC agent at a time)."""
        for k in [k for k in self.shared if k != key]:
            self.discard(k)
        world = self.shared.get(key)
        if world is not None and (world.closed or not all(world.alive(n) for n in world.names[1:])):
            self.discard(key)
            world = None
        return world

    def discard(self, key, graceful=True):
        world = self.shared.pop(key, None)
        if world is not None:
            world.close(graceful=graceful)
            _sweep_killed(world)

    def close_scope(self, scope_id):
        for key in [k for k in self.shared if k[0] == scope_id]:
            self.discard(key)

    def close_all(self):
        for key in list(self.shared):
            self.discard(key)


def _killed(world):
    """Workers killed by the test (``world.kill``) or by any signal: they could not clean up."""
    return {n for n, p in world.procs.items()
            if n in world.killed or (p.poll() is not None and p.poll() < 0)}


def _sweep_killed(world):
    """Remove what killed workers could not: their ipc dirs, segments, temp files."""
    pids = [world.procs[n].pid for n in _killed(world)]
    if pids:
        _remove(leaks.owned_paths(pids))


class TestWorlds:
    """The worlds of one test. ``test_modules``/``import_paths``: what every world of the
    test trusts and imports; ``deadline``/``timeout_method``: pytest-timeout's, if any;
    ``settle``: seconds a leftover may take to go away before it counts as a leak."""

    def __init__(self, registry, test_modules, import_paths, leak_check=True, deadline=None,
                 timeout_method=None, settle=1.0):
        self.registry = registry
        self.settle = settle  # how long leftovers may take to go away (RRef deletions and
        #                       context releases are messages; pool threads end after a job)
        self.test_modules, self.import_paths = test_modules, import_paths
        self.leak_check = leak_check
        self.deadline, self.timeout_method = deadline, timeout_method
        self.opened = []
        self.finished = []
        self.frozen = False
        self.watchdog = None
        self.hang_report = None
        self.hang_report_shown = False
        self.on_thread_timeout = None   # writes the hang report where the user sees it

    # ------------------------------------------------------------------ opening
    def open(self, n=2, transport="ipc", scope="function", scope_id=None, leak_check=None,
             **options):
        """A world of ``n`` workers for this test (``scope`` "function", or "module" /
        "session" to share it: ``scope_id`` names the module or session)."""
        if scope not in ("function", "module", "session"):
            raise ValueError(f"scope={scope!r}: must be 'function', 'module' or 'session'")
        leak_check = self.leak_check if leak_check is None else leak_check
        if scope == "function":
            self.registry.close_all()
            self._freeze()
            o = _Opened(None, None, leak_check)
            leaks.start_process_helpers()
            o.rank0_before = leaks.process_state()
            o.paths_before = set(leaks.owned_paths([os.getpid()]))
            o.world = World(n, transport, test_modules=self.test_modules,
                            import_paths=self.import_paths, **options).start()
        else:
            modules = dict(self.test_modules)
            if scope == "session":
                modules.update(self.registry.session_modules)
            key = (scope_id, n, transport, _options_key(options))
            world = self.registry.take(key)
            if world is None:
                world = World(n, transport, test_modules=modules,
                              import_paths=self.import_paths, **options).start()
                self.registry.shared[key] = world
            o = _Opened(world, key, leak_check)
        o.log_offsets = {name: o.world.log_size(name) for name in o.world.names[1:]}
        o.baseline, _ = self._states(o)
        self.opened.append(o)
        self._arm_watchdog()
        return o.world

    def worlds(self):
        return [o.world for o in self.opened if not o.world.closed]

    def logs(self):
        """[(name, output since the test got its world)] of every worker of every world
        (stack dumps, shown in the hang report, left out)."""
        return [(name, hangs.without_dumps(o.world.log_text(name, o.log_offsets.get(name, 0))))
                for o in self.opened + self.finished for name in o.world.names[1:]]

    def _states(self, o, collect=False):
        """({name: process state} of every rank, this process's first; {name: why a live
        worker did not say})."""
        world = o.world
        states = {world.names[0]: leaks.process_state(collect)}
        got, errors = world.remote_all("state", collect)
        states.update(got)
        return states, {n: f"{n} did not answer the leak check: {type(e).__name__}: "
                           f"{str(e).splitlines()[0]}" for n, e in errors.items()}

    def set_deadline(self, deadline, method):
        """pytest-timeout's deadline of the test (known once its timer is set)."""
        self.deadline, self.timeout_method = deadline, method
        if self.opened:
            self._arm_watchdog()

    def _arm_watchdog(self):
        if self.watchdog is not None or self.deadline is None:
            return
        left = self.deadline - time.monotonic()
        margin = min(2.0, 0.2 * max(left, 0.0))

        def on_report(text):
            self.hang_report = text
            if self.timeout_method == "thread" and self.on_thread_timeout is not None:
                self.on_thread_timeout(text)  # the process is about to end: say it now
        self.watchdog = hangs.Watchdog(left - margin, self.worlds, on_report)

    # ------------------------------------------------------------------ closing
    def finish(self, failed):
        """Check and close (or give back) every world; the sentences naming what the test
        left behind (empty when it failed anyway: its worlds are simply closed)."""
        if self.watchdog is not None:
            self.watchdog.cancel()
        problems, error = [], None
        while self.opened:
            o = self.opened.pop()
            self.finished.append(o)
            try:
                problems += self._finish_one(o, failed)
            except Exception as e:  # noqa: BLE001 - close the other worlds, then raise it
                error = error or e
        if self.frozen:
            gc.unfreeze()
            self.frozen = False
        if error is not None:
            raise error
        return problems

    def _freeze(self):
        """Leave what this process held before the test out of the garbage collections
        of the test's end (the RPC shutdown collects, to release RRefs held by cycles; in
        a test process that walks pytest's whole heap, most of a world's close)."""
        if not self.frozen:
            gc.freeze()
            self.frozen = True

    def _finish_one(self, o, failed):
        world = o.world
        if world.closed:
            return []
        if o.key is not None:  # a shared world: give it back as it was, or replace it
            world.clear_faults()
            if failed:
                self.registry.discard(o.key, graceful=False)
                return []
            problems = self._check_live(o, shared=True)
            if problems:
                self.registry.discard(o.key)
                problems.append("the shared world was replaced by a new one")
            return problems
        problems = []
        try:
            if o.leak_check and not failed:
                problems += self._check_live(o, shared=False)
        finally:
            # a world with leftovers may wait forever in a graceful shutdown (a pending call)
            world.close(graceful=not (failed or problems))
            _sweep_killed(world)
        if o.leak_check and not failed:
            problems += self._check_closed(o)
        return problems

    def _check_live(self, o, shared):
        """What the test left on its world's ranks while they still run (after ``settle`` s
        at most: deletions and releases travel as messages); a shared world must also have
        every worker alive and running. Child processes left behind are killed."""
        world = o.world
        if shared:
            problems = [f"{n} was left paused (SIGSTOP)" if n in world.paused else
                        f"{n} is dead ({'killed' if n in world.killed else 'it exited'})"
                        for n in world.names[1:] if n in world.paused or not world.alive(n)]
            if problems:
                return problems
        if not _serving():
            return []  # the test shut RPC down itself: its workers have left already
        server = forkserver.running_server()
        ignore = {server.pid} if server is not None else set()
        deadline = time.monotonic() + self.settle
        collect = False
        while True:
            states, silent = self._states(o, collect)
            problems, orphans = list(silent.values()), []
            for name, after in states.items():
                before = o.baseline.get(name)
                if before is None:
                    continue
                if name == world.names[0] and o.key is None:
                    # this process: only its RPC state now, the rest once the world is closed
                    after = dict(before, **{k: after[k] for k in
                                            ("rrefs", "pending", "pending_text", "contexts")})
                problems += leaks.differences(name, before, after, strict=False,
                                              ignore_children=ignore)
                orphans += leaks.new_children(before, after, ignore)
            if not problems or time.monotonic() > deadline:
                _kill(orphans, reap=False)  # their parent reaps them, or init once it exits
                return problems
            collect = True
            time.sleep(0.05)

    def _check_closed(self, o):
        """What the test left in this process and in the temp dirs once its world closed;
        child processes and files left behind are removed."""
        from distgrad.rpc import current_agent
        world = o.world
        pids = {n: p for n, p in world.pids().items() if n not in _killed(world)}
        deadline = time.monotonic() + self.settle
        collect = False
        while True:
            server = forkserver.running_server()
            ignore = {server.pid} if server is not None else set()
            # a retry collects garbage first: what only a reference cycle holds (a failed
            # Future's error, whose traceback holds the test's frame and its arrays, and
            # so their mappings of shared memory) is not left behind
            after = leaks.process_state(collect)
            problems = leaks.differences(
                "the test process", o.rank0_before, after, strict=True,
                ignore_fds=server.fds() if server is not None else (), ignore_children=ignore)
            agent = current_agent()
            if agent is not None and agent.running:
                problems.append(f"the test process: an RPC agent ({agent.name!r}) still runs "
                                "(init_rpc without shutdown)")
            paths = sorted(set(leaks.owned_paths(pids.values())) - o.paths_before)
            for path in paths:
                owner = next((n for n, p in pids.items() if f"-{p}-" in os.path.basename(path)),
                             "?")
                problems.append(f"{owner}: {path} was left behind (removed now)")
            if not problems or time.monotonic() > deadline:
                _kill(leaks.new_children(o.rank0_before, after, ignore), reap=True)
                _remove(paths)
                return problems
            collect = True
            time.sleep(0.05)


def _kill(pids, reap):
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
            if reap:
                os.waitpid(pid, 0)
        except (ProcessLookupError, ChildProcessError):
            pass


def _remove(paths):
    for path in paths:
        remove_path(path)


def _serving():
    from distgrad.rpc import current_agent
    agent = current_agent()
    return agent is not None and agent.running


def _options_key(options):
    return tuple(sorted((k, tuple(v) if isinstance(v, list) else v) for k, v in options.items()))

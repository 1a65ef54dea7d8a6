"""SPMD tests: one test function run on every rank of a world, each rank its own process.

    @pytest.mark.world(3)
    def test_ring(rank, world_size):
        peer = f"worker{(rank + 1) % world_size}"
        assert rpc.rpc_sync(peer, operator.add, (rank, 1)) == rank + 1

Rank 0 is the test process (pytest's fixtures, debugger and output work there as
usual); ranks 1.. are a world's workers, which run the same function through
:func:`run_here` (the harness calls it, ``remote.run_test``), importing the test
module themselves from the file pytest collected, with its asserts rewritten as
pytest rewrites them. The test passes when every rank passes; a failure shows each
failing rank's traceback under its rank; a skip on any rank skips it. When a rank
fails, the others get a grace period to finish; then rank 0 is interrupted, and the
ranks still running are shown with their stacks and pending calls (a rank waiting
for a failed peer would otherwise wait until the timeout).

What reaches ranks 1..: ``rank`` (each its own), ``world_size``, parametrized
arguments and fixture values that are plain data (numbers, strings, bytes, paths,
lists, tuples, dicts, arrays, tensors); ``spmd_world`` is None there.
"""
import ast
import importlib.abc
import importlib.machinery
import importlib.util
import json
import os
import pathlib
import signal
import sys
import threading
import time

__all__ = ["run_everywhere", "run_here", "install_test_modules", "RankFailures",
           "RankInterrupted", "SpmdUsageError"]

#: Environment variable naming the test modules a world's worker may load: JSON {name: file}
#: (set by the harness when it starts the worker, never taken from a message).
TEST_MODULES_ENV = "DISTGRAD_TEST_MODULES"
#: The module of functions the harness calls on a world's workers; allowed there only.
HARNESS_MODULE = "distgrad.testing.remote"
#: How long the other ranks may go on after one failed, before they are interrupted.
GRACE = 1.0
#: Interrupts rank 0's test function (a Python handler, only while that function runs).
_INTERRUPT = signal.SIGUSR2


class SpmdUsageError(TypeError):
    """An SPMD test asks for something that cannot reach every rank."""


class RankInterrupted(Exception):
    """Raised in rank 0's test function when another rank failed and rank 0 did not finish
    within the grace period."""


class RankFailures(Exception):
    """Some ranks failed: ``parts`` is [(rank, title, body)], body a pytest TerminalRepr
    or text. The plugin turns it into the test's report."""

    def __init__(self, parts):
        self.parts = parts
        super().__init__("; ".join(f"rank {r}: {title}" for r, title, _ in parts))


# ---------------------------------------------------------------------- ranks 1..
class _RewritingLoader(importlib.machinery.SourceFileLoader):
    """Loads a test module with its asserts rewritten (pytest's rewriter, without its
    bytecode cache: the plain .pyc of the file must not get rewritten code)."""

    def get_code(self, fullname):
        path = self.get_filename(fullname)
        source = self.get_data(path)
        tree = ast.parse(source, filename=path)
        try:
            from _pytest.assertion.rewrite import rewrite_asserts
        except ImportError:  # no pytest here: plain asserts still fail, without details
            pass
        else:
            rewrite_asserts(tree, source, path)
        return compile(tree, path, "exec", dont_inherit=True)


class _TestModuleFinder(importlib.abc.MetaPathFinder):
    """Finds exactly the test modules of the world (``{name: file}``, from the environment
    the harness started this worker with, never from a message), also when pytest
    imported them by file path; their parent packages, when nothing else finds them,
    become empty namespace packages."""

    def __init__(self, table):
        self.table = table
        self.parents = {n.rpartition(".")[0] for n in table if "." in n}
        self.parents |= {p.rpartition(".")[0] for p in list(self.parents) if "." in p}

    def find_spec(self, name, path=None, target=None):
        file = self.table.get(name)
        if file is not None:
            return importlib.util.spec_from_file_location(name, file,
                                                          loader=_RewritingLoader(name, file))
        if name in self.parents:
            for finder in sys.meta_path:
                if finder is not self and hasattr(finder, "find_spec"):
                    spec = finder.find_spec(name, path, target)
                    if spec is not None:
                        return spec
            spec = importlib.machinery.ModuleSpec(name, None, is_package=True)
            spec.submodule_search_locations = []
            return spec
        return None


_finder = None
_finder_lock = threading.Lock()


def install_test_modules():
    """Let this process import its world's test modules (idempotent); their table."""
    global _finder
    with _finder_lock:
        if _finder is None:
            table = json.loads(os.environ.get(TEST_MODULES_ENV) or "{}")
            _finder = _TestModuleFinder({str(k): str(v) for k, v in table.items()})
            sys.meta_path.insert(0, _finder)
        return _finder.table


def run_here(module, qualname, kwargs):
    """Run the test ``module:qualname`` on this rank; its outcome as plain data."""
    from distgrad.rpc.allowlist import Allowlist
    from distgrad.rpc.errors import RefusedCallError
    if module not in install_test_modules():
        raise RefusedCallError(f"{module!r} is not a test module of this world")
    allow = Allowlist([module])
    fn = allow.resolve(f"{module}:{qualname}")
    owner = qualname.rpartition(".")[0]
    if owner:  # a test method: on a fresh instance, as pytest makes one per test
        fn = fn.__get__(allow.resolve(f"{module}:{owner}")())
    return run_function(fn, _decode_kwargs(kwargs))


def run_function(fn, kwargs):
    """Call a test function; its outcome: passed, skipped or xfailed (with the message), or
    failed (with pytest's text of the failure)."""
    import pytest
    __tracebackhide__ = True
    try:
        fn(**kwargs)
    except pytest.skip.Exception as e:
        return {"outcome": "skipped", "message": str(e.msg)}
    except pytest.xfail.Exception as e:
        return {"outcome": "xfailed", "message": str(e.msg)}
    except BaseException as e:  # noqa: BLE001 - every failure of the test is reported
        info = pytest.ExceptionInfo.from_exception(e)
        return {"outcome": "failed", "crash": info.exconly(tryshort=True).splitlines()[0][:300],
                "text": str(info.getrepr(style="long", funcargs=False, tbfilter=True))}
    return {"outcome": "passed"}


def _decode_kwargs(spec):
    out = {}
    for name, kind, value in spec:
        out[name] = pathlib.Path(value) if kind == "path" else value
    return out


# ---------------------------------------------------------------------- rank 0
def _plain(value, depth=0):
    if value is None or isinstance(value, (bool, int, float, complex, str, bytes)):
        return True
    if depth > 32:
        return False
    if isinstance(value, (list, tuple)):
        return all(_plain(v, depth + 1) for v in value)
    if isinstance(value, dict):
        return all(isinstance(k, str) and _plain(v, depth + 1) for k, v in value.items())
    import numpy as np
    if isinstance(value, (np.ndarray, np.generic)):
        return value.dtype != object
    from distgrad._tensor import Tensor
    return isinstance(value, Tensor)


def remote_kwargs(item, argnames, world_size):
    """[[name, kind, value]] of the test's arguments for ranks 1.. (``rank`` is filled in
    per rank); SpmdUsageError naming an argument that cannot travel."""
    spec = []
    for name in argnames:
        value = item.funcargs[name]
        if name == "spmd_world":
            spec.append([name, "value", None])
        elif isinstance(value, pathlib.PurePath):
            spec.append([name, "path", str(value)])
        elif name == "rank" or _plain(value):
            spec.append([name, "value", value])
        else:
            raise SpmdUsageError(
                f"{item.nodeid}: argument {name!r} ({type(value).__module__}."
                f"{type(value).__qualname__}) cannot reach ranks 1..{world_size - 1}:"
                " an SPMD test runs in every rank's own process, and only rank, world_size, "
                "parametrized arguments and plain-data fixture values (numbers, strings, paths, "
                "lists, dicts, arrays, tensors) go there")
    return spec


def function_reference(item):
    """(module, qualname) of the test function, as ranks 1.. find it."""
    fn = getattr(item.obj, "__func__", item.obj)
    return fn.__module__, fn.__qualname__


class _Interrupter:
    """Raises :class:`RankInterrupted` in rank 0's test function (the main thread) a grace
    period after another rank failed; a signal, so a wait in C is interrupted too."""

    def __init__(self, grace):
        self.grace = grace
        self.running = False
        self.cause = None
        self._timer = None
        self._lock = threading.Lock()
        self._previous = None
        self._armed = threading.current_thread() is threading.main_thread()

    def __enter__(self):
        if self._armed:
            self._previous = signal.signal(_INTERRUPT, self._handler)
        self.running = True
        return self

    def __exit__(self, *exc):
        with self._lock:
            self.running = False
            timer = self._timer
        if timer is not None:
            timer.cancel()
            timer.join()
        if self._armed:
            signal.signal(_INTERRUPT, self._previous)
        return False

    def trouble(self, cause):
        """Another rank failed (any thread)."""
        with self._lock:
            if not self.running or self._timer is not None or not self._armed:
                return
            self.cause = cause
            self._timer = threading.Timer(self.grace, self._fire)
            self._timer.name = "distgrad-spmd-grace"
            self._timer.daemon = True
            self._timer.start()

    def _fire(self):
        with self._lock:
            if self.running:
                signal.pthread_kill(threading.main_thread().ident, _INTERRUPT)

    def _handler(self, signum, frame):
        if self.running:
            raise RankInterrupted(self.cause)


def _rank0(item, kwargs, grace):
    """Run rank 0's part; (outcome, title, body)."""
    import pytest
    try:
        item.obj(**kwargs)
    except (KeyboardInterrupt, SystemExit):
        raise
    except pytest.skip.Exception as e:
        return "skipped", str(e.msg), None
    except pytest.xfail.Exception as e:
        return "xfailed", str(e.msg), None
    except RankInterrupted as e:
        return "interrupted", f"interrupted {grace:g} s after {e.args[0]}", None
    except BaseException as e:  # noqa: BLE001 - the failure of rank 0 is part of the report
        info = pytest.ExceptionInfo.from_exception(e)
        return "failed", info.exconly(tryshort=True).splitlines()[0][:300], item.repr_failure(info)
    return "passed", "", None


def _remote_outcome(fut, name, world):
    try:
        result = fut.value()
    except Exception as e:  # noqa: BLE001 - the rank's process died, or the call failed
        if name in world.killed:
            return "killed", f"{name} was killed by the test", None
        return "failed", f"{type(e).__name__}: {str(e).splitlines()[0][:300]}", str(e)
    if result["outcome"] == "failed":
        return "failed", result["crash"], result["text"]
    return result["outcome"], result.get("message", ""), None


def run_everywhere(item, world, timeout, grace=GRACE, dump=None):
    """Run the SPMD test ``item`` on every rank of ``world``; return if every rank passed,
    raise pytest's skip/xfail if a rank did so, RankFailures otherwise. ``timeout`` bounds
    the wait for ranks 1.. once rank 0 is done; ``dump(names)`` gives the stacks and
    pending calls of ranks still running then."""
    import pytest
    from distgrad.rpc import api
    argnames = item._fixtureinfo.argnames
    kwargs = {name: item.funcargs[name] for name in argnames}
    spec = remote_kwargs(item, argnames, world.world_size)
    module, qualname = function_reference(item)
    interrupter = _Interrupter(grace)
    futs = {}
    for rank in range(1, world.world_size):
        name = world.names[rank]
        args = [[n, k, rank if n == "rank" else v] for n, k, v in spec]
        fut = api.rpc_async(name, f"{HARNESS_MODULE}:run_test", (module, qualname, args), timeout=0)
        fut.add_done_callback(lambda f, r=rank, n=name: None if _passed(f, n, world)
                              else interrupter.trouble(f"rank {r} failed"))
        futs[rank] = fut
    started = time.monotonic()
    rank0 = ("interrupted", f"interrupted {grace:g} s after another rank failed", None)
    try:
        with interrupter:
            rank0 = _rank0(item, kwargs, grace)
    except RankInterrupted:  # it came as rank 0's function returned: another rank failed
        pass
    outcomes = {0: rank0}
    deadline = time.monotonic() + timeout
    unfinished, timed_out = [], ""
    try:
        while True:
            trouble = outcomes[0][0] != "passed" or any(
                not _passed(f, world.names[r], world) for r, f in futs.items())
            if trouble:
                deadline = min(deadline, time.monotonic() + grace)
            left = [r for r, f in futs.items() if not f.done()]
            if not left or time.monotonic() >= deadline:
                unfinished = left
                break
            futs[left[0]].wait_done(min(0.05, max(0.0, deadline - time.monotonic())))
    except pytest.fail.Exception as e:  # pytest-timeout: report what we know, with the stacks
        unfinished = [r for r, f in futs.items() if not f.done()]
        timed_out = f" ({str(e.msg).splitlines()[0]})"
    for rank, f in futs.items():
        if rank not in unfinished:
            outcomes[rank] = _remote_outcome(f, world.names[rank], world)
    if unfinished:
        names = [world.names[r] for r in unfinished]
        stacks = dump(names) if dump is not None else {}
        waited = time.monotonic() - started
        for r in unfinished:
            outcomes[r] = ("unfinished", f"still running after {waited:.1f} s{timed_out}",
                           stacks.get(world.names[r], "(no stacks)"))
    return _conclude(outcomes)


def _passed(fut, name, world):
    """Whether a rank is still fine: running, passed, or killed on purpose by the test."""
    if not fut.done() or name in world.killed:
        return True
    try:
        return fut.value()["outcome"] == "passed"
    except Exception:  # noqa: BLE001 - its process died
        return False


def _conclude(outcomes):
    import pytest
    bad = [(r, o) for r, o in sorted(outcomes.items()) if o[0] in ("failed", "unfinished")]
    if bad:
        parts = [(r, title, body) for r, (_, title, body) in bad]
        parts += [(r, title, None) for r, (kind, title, _) in sorted(outcomes.items())
                  if kind in ("interrupted", "skipped", "xfailed")]
        raise RankFailures(sorted(parts, key=lambda p: p[0]))
    for r, o in sorted(outcomes.items()):
        if o[0] == "skipped":  # reported at the test's location, not this line's
            raise pytest.skip.Exception(f"rank {r}: {o[1]}", _use_item_location=True)
    for r, o in sorted(outcomes.items()):
        if o[0] == "xfailed":
            pytest.xfail(f"rank {r}: {o[1]}")

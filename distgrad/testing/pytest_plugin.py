"""pytest plugin (entry point ``pytest11: distgrad``): tests that run several local processes.

Loaded in every pytest run, so it imports nothing heavy until a test uses a world.

A world for the test, this process as rank 0 (``worker0``)::

    def test_scale(rpc_world):
        world = rpc_world(2)                       # worker1, worker2
        assert rpc.rpc_sync("worker1", mylib.scale, (3,)) == 6

The same function on every rank, each rank its own process (SPMD)::

    @pytest.mark.world(3)                          # or world([2, 4]): one test per size
    def test_ring(rank, world_size):
        assert rpc.rpc_sync(f"worker{(rank + 1) % world_size}", mylib.scale, (rank,)) == 2 * rank

Around every test that used a world: its worker logs in the report when it fails;
stacks and pending calls of every rank in the report when it times out
(pytest-timeout); a leak check when it passed (threads, child processes,
descriptors, ipc/shared-memory/temp files, RRefs, autograd contexts, pending calls
on any rank; ``@pytest.mark.no_leak_check`` or ``leak_check=False`` to skip it).
``scope="module"``/``"session"`` shares a world between tests, each of which must
leave it as it found it. Faults: ``world.kill/pause/resume(name)`` and
``world.faults`` (see ``faults.py``).

Workers run the test modules (and conftest modules) of the test and the modules in
``allowed_modules`` or the ini option ``distgrad_allowed_modules``; everything else
is refused as usual, with an error that names those two (:data:`ALLOW_ADVICE`).
"""
import os
import sys
import time
import types

import pytest
from _pytest._code.code import ReprFileLocation, TerminalRepr

_TEST_WORLDS = pytest.StashKey()    # item -> harness.TestWorlds
_REPORTS = pytest.StashKey()        # item -> {"setup"|"call"|"teardown": report}
_TIMEOUT = pytest.StashKey()        # item -> (deadline, method) of pytest-timeout
_REGISTRY = pytest.StashKey()       # config -> harness.Registry
_WORLD_MODULES = pytest.StashKey()  # config -> {module: file} of the tests that use worlds
_HANG_SECTION = "distgrad: stacks and pending calls of every rank"
#: How a refused module is allowed in a test world: what a refusal on any rank says
ALLOW_ADVICE = ("add {module} to distgrad_allowed_modules in the pytest ini file (pytest.ini, "
                "or [tool.pytest.ini_options] in pyproject.toml), or pass "
                "allowed_modules=['{module}'] to rpc_world(...) or @pytest.mark.world(...)")


def pytest_addoption(parser):
    parser.addini("distgrad_allowed_modules", type="linelist", default=[],
                  help="modules whose functions and classes every rank of a test world may run "
                       "for its peers (besides the test and conftest modules)")
    parser.addini("distgrad_leak_check", type="bool", default=True,
                  help="check every test that used a world for leaks (default: true)")
    parser.addini("distgrad_leak_settle", default="1.0",
                  help="seconds a leak may take to go away before it counts (RRef deletions "
                       "and context releases are messages; default: 1.0)")
    parser.addini("distgrad_spmd_timeout", default="300",
                  help="seconds an SPMD test waits for its other ranks once rank 0 is done "
                       "(default: 300)")


_sessions = 0  # pytest sessions running in this process (pytester nests them)


def pytest_configure(config):
    global _sessions
    _sessions += 1
    config.addinivalue_line(
        "markers", "world(size, *, scope='function', transport='ipc', timeout=None, "
                   "leak_check=None, **options): run the test on every rank of a world of "
                   "`size` processes (a list: one test per size); it takes `rank` and "
                   "`world_size` (distgrad)")
    config.addinivalue_line(
        "markers", "no_leak_check: do not check this test's worlds for leaks (distgrad)")


# ---------------------------------------------------------------------- collection
def _world_sizes(marker, where):
    sizes = marker.args[0] if marker.args else marker.kwargs.get("size")
    many = isinstance(sizes, (list, tuple))
    for s in (sizes if many else [sizes]):
        if type(s) is not int or s < 1:
            raise pytest.UsageError(f"{where}: @pytest.mark.world needs a world size (an int >= 1, "
                                    f"or a list of them), not {sizes!r}")
    return list(sizes) if many else sizes


def pytest_generate_tests(metafunc):
    marker = metafunc.definition.get_closest_marker("world")
    if marker is None:
        return
    sizes = _world_sizes(marker, metafunc.definition.nodeid)
    if isinstance(sizes, list):
        if "world_size" not in metafunc.fixturenames:
            metafunc.fixturenames.append("world_size")
        metafunc.parametrize("world_size", sizes, ids=[f"world{s}" for s in sizes])


def pytest_itemcollected(item):
    # every SPMD test gets its world (after parametrization, which prunes fixture names)
    if item.get_closest_marker("world") is not None and hasattr(item, "fixturenames") \
            and "spmd_world" not in item.fixturenames:
        item.fixturenames.append("spmd_world")


def _uses_world(item):
    names = getattr(item, "fixturenames", ())
    return "rpc_world" in names or "spmd_world" in names


def pytest_collection_finish(session):
    modules = {}
    for item in session.items:
        if _uses_world(item):
            modules.update(_test_modules(item))
    session.config.stash[_WORLD_MODULES] = modules
    if modules and sys.platform.startswith("linux"):  # start the fork server meanwhile
        from . import forkserver
        from .world import _ROOT
        forkserver.fork_server([_ROOT, *sys.path])


def _test_modules(item):
    """{name: file} of the test's module and of the conftest modules above it."""
    module = getattr(item, "module", None)
    if module is None or not getattr(module, "__file__", None):
        return {}
    table = {module.__name__: module.__file__}
    here = os.path.dirname(os.path.abspath(module.__file__))
    for plugin in item.config.pluginmanager.get_plugins():
        f = getattr(plugin, "__file__", None) if isinstance(plugin, types.ModuleType) else None
        if f and os.path.basename(f) == "conftest.py":
            d = os.path.dirname(os.path.abspath(f))
            if here == d or here.startswith(d + os.sep):
                table.setdefault(plugin.__name__, f)
    return table


def _import_paths(item):
    """pytest's rootdir and the folders of the test's conftest modules."""
    dirs = [str(item.config.rootpath)]
    dirs += [os.path.dirname(f) for n, f in _test_modules(item).items() if f.endswith("conftest.py")]
    return list(dict.fromkeys(dirs))


# ---------------------------------------------------------------------- worlds of a test
def _registry(config):
    reg = config.stash.get(_REGISTRY, None)
    if reg is None:
        from .harness import Registry
        reg = config.stash[_REGISTRY] = Registry(config.stash.get(_WORLD_MODULES, {}))
    return reg


def _test_worlds(request):
    item = request.node
    tw = item.stash.get(_TEST_WORLDS, None)
    if tw is None:
        from .harness import TestWorlds
        deadline, method = item.stash.get(_TIMEOUT, (None, None))
        tw = TestWorlds(_registry(item.config), _test_modules(item), _import_paths(item),
                        leak_check=item.config.getini("distgrad_leak_check")
                        and item.get_closest_marker("no_leak_check") is None,
                        deadline=deadline, timeout_method=method,
                        settle=float(item.config.getini("distgrad_leak_settle")))
        tw.on_thread_timeout = lambda text: _write_now(item.config, item, text)
        item.stash[_TEST_WORLDS] = tw
    return tw


def _scope_id(item, scope):
    if scope == "module":
        module = item.getparent(pytest.Module)
        return module.nodeid if module is not None else item.nodeid
    return "session" if scope == "session" else None


def _allowed(config, options):
    """``options`` with the modules a world allows, and how to allow another."""
    options["allowed_modules"] = list(dict.fromkeys([*config.getini("distgrad_allowed_modules"),
                                                     *options.get("allowed_modules", ())]))
    options.setdefault("allow_advice", ALLOW_ADVICE)
    return options


def _finish(request, tw):
    item = request.node
    call = item.stash.get(_REPORTS, {}).get("call")
    problems = tw.finish(failed=call is None or call.failed)
    if problems:
        from .harness import LEAK_HINT
        for name, text in tw.logs():
            if text:
                sys.stderr.write(f"\n----- log of {name} -----\n{text}")
        pytest.fail("distgrad: the test left things behind " + LEAK_HINT + ":\n"
                    + "\n".join(f"  - {p}" for p in problems), pytrace=False)


@pytest.fixture
def rpc_world(request):
    """Factory: ``rpc_world(n=2, transport="ipc", *, scope="function", leak_check=None,
    **options)`` -> :class:`~distgrad.testing.world.World` of ``n`` workers, this process
    joined as ``worker0``. ``options`` are RpcBackendOptions fields (``allowed_modules``,
    ``rpc_timeout``...) and World's (``worker_env``, ``start_method``, ``hosts=2``: the
    workers on simulated hosts, skipped where those cannot be made...)."""
    tw = _test_worlds(request)

    def start(n=2, transport="ipc", *, scope="function", leak_check=None, **options):
        if options.get("hosts") is not None:  # simulated hosts: skipped where none can be made
            from .hosts import unavailable
            why = unavailable()
            if why is not None:
                pytest.skip(why)
        return tw.open(n, transport, scope, _scope_id(request.node, scope), leak_check,
                       **_allowed(request.config, options))
    yield start
    _finish(request, tw)


@pytest.fixture
def simulated_hosts():
    """Factory: ``simulated_hosts(n=2, *, bandwidth=None, private_shm=False, ipv6=False,
    attach_caller=False)`` -> :class:`~distgrad.testing.hosts.SimulatedHosts`: ``n``
    hosts (network namespaces on a switch), removed with everything running on them when
    the test ends, passed or failed. Skips the test, with the reason, where hosts cannot
    be made (not root, no namespaces)."""
    from . import hosts

    why = hosts.unavailable()
    if why is not None:
        pytest.skip(why)
    made = []

    def make(n=2, **options):
        made.append(hosts.SimulatedHosts(n, **options))
        return made[-1]
    try:
        yield make
    finally:
        for h in made:
            h.close()


@pytest.fixture
def world_size(request):
    """The number of processes of this SPMD test's world (``@pytest.mark.world(size)``)."""
    marker = request.node.get_closest_marker("world")
    if marker is None:
        pytest.fail("world_size is for tests marked @pytest.mark.world(size)", pytrace=False)
    return _world_sizes(marker, request.node.nodeid)


@pytest.fixture
def rank(request):
    """This process's rank in an SPMD test: 0 here, in the test process (the other ranks
    get theirs when the harness calls the test function there)."""
    if request.node.get_closest_marker("world") is None:
        pytest.fail("rank is for tests marked @pytest.mark.world(size)", pytrace=False)
    return 0


@pytest.fixture
def spmd_world(request, world_size):
    """The World of an SPMD test (on rank 0; None on the other ranks)."""
    marker = request.node.get_closest_marker("world")
    if marker is None:
        pytest.fail("spmd_world is for tests marked @pytest.mark.world(size)", pytrace=False)
    options = {k: v for k, v in marker.kwargs.items() if k not in ("size", "timeout")}
    scope = options.pop("scope", "function")
    transport = options.pop("transport", "ipc")
    leak_check = options.pop("leak_check", None)
    tw = _test_worlds(request)
    try:
        world = tw.open(world_size - 1, transport, scope, _scope_id(request.node, scope),
                        leak_check, **_allowed(request.config, options))
    except BaseException:
        tw.finish(failed=True)  # what did start is closed
        raise
    yield world
    _finish(request, tw)


# ---------------------------------------------------------------------- running, reporting
@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem):
    marker = pyfuncitem.get_closest_marker("world")
    if marker is None or "spmd_world" not in pyfuncitem.funcargs:
        return None
    from . import hangs, spmd
    world = pyfuncitem.funcargs["spmd_world"]
    timeout = marker.kwargs.get("timeout") or float(pyfuncitem.config.getini(
        "distgrad_spmd_timeout"))
    try:
        spmd.run_everywhere(pyfuncitem, world, timeout,
                            dump=lambda names: hangs.dump_workers(world, names))
    except spmd.SpmdUsageError as e:
        misuse = str(e)
    else:
        return True
    pytest.fail(misuse, pytrace=False)


class RankFailuresRepr(TerminalRepr):
    """The report of an SPMD test: each failing rank's traceback under its rank."""

    def __init__(self, item, parts):
        self.parts = parts
        r, title, _ = parts[0]
        others = [str(p[0]) for p in parts[1:]]
        more = f" (and rank {', '.join(others)})" if others else ""
        path, lineno = item.location[0], (item.location[1] or 0) + 1
        self.reprcrash = ReprFileLocation(path, lineno, f"rank {r}: {title}{more}")

    def toterminal(self, tw):
        tw.line(self.reprcrash.message)  # the first line: what a one-line summary shows
        for r, title, body in self.parts:
            tw.sep("-", f"rank {r}: {title}", bold=True)
            if body is None:
                continue
            if hasattr(body, "toterminal"):
                body.toterminal(tw)
            else:
                for line in str(body).rstrip().splitlines():
                    tw.line(line)


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(item, call):
    rep = yield
    item.stash.setdefault(_REPORTS, {})[rep.when] = rep
    spmd = sys.modules.get("distgrad.testing.spmd")
    ranks_shown = spmd is not None and call.excinfo is not None \
        and isinstance(call.excinfo.value, spmd.RankFailures)
    if ranks_shown:  # each rank's traceback, or its stacks if it did not finish
        rep.longrepr = RankFailuresRepr(item, call.excinfo.value.parts)
    tw = item.stash.get(_TEST_WORLDS, None)
    if tw is not None and rep.failed:
        if tw.hang_report and not tw.hang_report_shown and not ranks_shown:
            rep.sections.append((_HANG_SECTION, tw.hang_report))
            tw.hang_report_shown = True
        if rep.when == "call":
            for name, text in tw.logs():
                if text:
                    rep.sections.append((f"distgrad: log of {name}", text.rstrip()))
    return rep


@pytest.hookimpl(optionalhook=True, tryfirst=True)
def pytest_timeout_set_timer(item, settings):
    """pytest-timeout is about to time the test: remember when, for the hang watchdog."""
    deadline = time.monotonic() + settings.timeout
    item.stash[_TIMEOUT] = (deadline, settings.method)
    tw = item.stash.get(_TEST_WORLDS, None)
    if tw is not None:
        tw.set_deadline(deadline, settings.method)


def _write_now(config, item, text):
    """pytest-timeout's thread method ends the process: show the hang report first."""
    capman = config.pluginmanager.getplugin("capturemanager")
    if capman is not None:
        capman.suspend_global_capture(item)
    terminal = config.get_terminal_writer()
    terminal.sep("+", title=_HANG_SECTION)
    terminal.write(text + "\n")
    terminal.flush()


@pytest.hookimpl(wrapper=True, trylast=True)
def pytest_runtest_teardown(item, nextitem):
    try:
        return (yield)
    finally:
        reg = item.config.stash.get(_REGISTRY, None)
        if reg is not None and reg.shared:
            if nextitem is None:
                reg.close_all()
            elif getattr(nextitem, "module", None) is not getattr(item, "module", None):
                reg.close_scope(_scope_id(item, "module"))


def pytest_unconfigure(config):
    global _sessions
    _sessions -= 1
    reg = config.stash.get(_REGISTRY, None)
    if reg is not None:
        reg.close_all()
    fs = sys.modules.get("distgrad.testing.forkserver")
    if fs is not None and _sessions == 0:  # the last session of the process ends
        fs.stop_server()

"""Collection-wide settings.

The RPC and distributed tests need pyzmq and msgpack, which ``pip install -e .``
installs with distgrad. Run with an interpreter that lacks them (a system pytest on
a source checkout, say), those directories are reported as skipped, with the reason,
instead of failing to import and stopping the whole run.
"""
import compileall
import importlib.util
import pathlib
import sys

import pytest

_MISSING = [name for name in ("zmq", "msgpack") if importlib.util.find_spec(name) is None]
_NEEDS_RPC = ("rpc", "distributed")
_SKIPPED_KEY = pytest.StashKey[list]()


_ROOT = pathlib.Path(__file__).resolve().parents[1]
#: What the suite's processes import from the checkout.
_COMPILED = ("distgrad", "tests", "scripts")


def pytest_configure(config):
    """Where this environment forbids Python to write bytecode (PYTHONDONTWRITEBYTECODE),
    compile the checkout's modules once, before any test starts: the suite starts about
    900 Python processes, and each would otherwise compile every distgrad module it
    imports from source again: a worker's imports took 0.6-0.8 s of CPU from source
    against 0.35-0.45 s from the cache, and the whole suite 695 s against 458 s on 2 cores.
    Python still reads the cache under that setting, and checks each file against its
    source. The files go where Python puts them (``__pycache__``, ignored by git); the
    controller compiles, not each xdist worker.
    """
    if not sys.dont_write_bytecode or hasattr(config, "workerinput"):
        return
    for name in _COMPILED:
        try:
            compileall.compile_dir(_ROOT / name, quiet=2)
        except OSError:  # a read-only checkout: every process compiles for itself, as before
            return


def pytest_ignore_collect(collection_path, config):
    if _MISSING and collection_path.parent.name in _NEEDS_RPC and collection_path.suffix == ".py":
        config.stash.setdefault(_SKIPPED_KEY, []).append(collection_path.name)
        return True
    return None


def pytest_collection_finish(session):
    skipped = session.config.stash.get(_SKIPPED_KEY, [])
    if skipped:
        session.config.get_terminal_writer().line(
            f"SKIPPED {len(skipped)} RPC/distributed test files: "
            f"{', '.join(_MISSING)} not installed (pip install -e '.[test]' installs them)",
            yellow=True)


def pytest_collection_modifyitems(config, items):
    """Tests marked slow run with ``-m slow`` only (pyproject.toml's marker): minutes of
    CPU each (PyTorch's torchrun as an oracle, resumes across hosts), kept out of the
    default run so that it stays within minutes on 2 cores."""
    if "slow" in (config.getoption("markexpr") or ""):
        return
    skip = pytest.mark.skip(reason="marked slow: run with -m slow")
    for item in items:
        if item.get_closest_marker("slow"):
            item.add_marker(skip)


#: The suite's own modules that its workers may run (``tests/support``).
SUPPORT_MODULES = ["support"]


@pytest.fixture
def rpc_world(rpc_world):
    """The plugin's ``rpc_world``, with this suite's helper modules allowed on every worker."""
    def start(n=2, **options):
        options["allowed_modules"] = SUPPORT_MODULES + list(options.get("allowed_modules", ()))
        return rpc_world(n, **options)
    return start


@pytest.fixture(autouse=True)
def _world_secret_of_this_test_only(monkeypatch):
    """A process that started a world's members keeps the secret it made for them, and one
    that joined a world without a secret remembers it (``distgrad/utils/world_secret.py``):
    right for a program, wrong between two tests that share a pytest worker. Each test
    starts without either, whatever the tests before it in this worker started."""
    from distgrad.utils import world_secret
    monkeypatch.setattr(world_secret, "_made", None)
    monkeypatch.setattr(world_secret, "_without", False)

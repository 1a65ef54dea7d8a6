"""Collection-wide settings.

The RPC and distributed tests need pyzmq and msgpack, which ``pip install -e .``
installs with distgrad. Run with an interpreter that lacks them (a system pytest on
a source checkout, say), those directories are reported as skipped, with the reason,
instead of failing to import and stopping the whole run.
"""
import importlib.util

import pytest

_MISSING = [name for name in ("zmq", "msgpack") if importlib.util.find_spec(name) is None]
_NEEDS_RPC = ("rpc", "distributed")
_SKIPPED_KEY = pytest.StashKey[list]()


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

"""The harness's own tests: example test files run through pytest's ``pytester``.

Example runs are in-process (fast) unless they need their own process (a timeout
that ends the process, an installed distgrad); either way the example's worlds
are closed and reaped by the example's own session.
"""
import os
from pathlib import Path

import pytest

import distgrad

# imported here, so that an in-process example run (which forgets the modules it imported)
# does not import them a second time
import distgrad.distributed.autograd  # noqa: F401
import distgrad.distributed.rpc  # noqa: F401
import distgrad.testing.harness  # noqa: F401
import distgrad.testing.hangs  # noqa: F401
import distgrad.testing.remote  # noqa: F401
from distgrad.rpc.allowlist import default_entry_points

# the allowlist caches distgrad's entry points once per process, importing the modules
# that define them: done inside an example run, the run would forget those modules and
# a later test of this process would import new objects the cache does not know
default_entry_points()

pytest_plugins = ["pytester"]


@pytest.fixture
def example(pytester):
    """``example(source, *args, ini="")`` runs ``source`` as ``test_example.py`` in-process
    and returns pytest's RunResult."""
    def run(source, *args, ini=""):
        pytester.makeini("[pytest]\ndistgrad_leak_settle = 0.3\n" + ini)
        pytester.makepyfile(test_example=source)
        return pytester.runpytest_inprocess("-p", "no:cacheprovider", "-p", "no:randomly", *args)
    return run


@pytest.fixture
def example_subprocess(pytester, monkeypatch):
    """``example_subprocess(source, *args)`` runs ``source`` as ``test_example.py`` in a new
    pytest process that imports this distgrad."""
    root = str(Path(distgrad.__file__).resolve().parents[1])
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(
        p for p in (root, os.environ.get("PYTHONPATH")) if p))

    def run(source, *args, timeout=60):
        pytester.makepyfile(test_example=source)
        return pytester.runpytest_subprocess("-p", "no:cacheprovider", "-p", "no:randomly", *args,
                                             timeout=timeout)
    return run

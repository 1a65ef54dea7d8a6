"""What a world's workers run for the test harness, and nothing else.

Peers may call these functions only on the workers of a
:class:`~distgrad.testing.world.World`, which start with ``--allow
distgrad.testing.remote``; ``distgrad.testing`` is off the default allowlist
everywhere else. They report state, run one rank of an SPMD test (only a test
module the world was started with), and set message-fault rules; none writes
files, starts processes or reads the environment on a peer's say-so.
"""
from . import faults, leaks, spmd

__all__ = ["state", "run_test", "add_fault", "remove_faults", "fault_counts"]


def state(collect=False):
    """This worker's state for leak checks (:func:`distgrad.testing.leaks.process_state`)."""
    spmd.install_test_modules()
    return leaks.process_state(collect)


def run_test(module, qualname, kwargs):
    """Run this rank's part of an SPMD test; its outcome."""
    return spmd.run_here(module, qualname, kwargs)


def add_fault(rule):
    faults.install(rule)


def remove_faults(ids=None):
    faults.uninstall(ids)


def fault_counts():
    return faults.counts()

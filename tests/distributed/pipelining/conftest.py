"""One 4-rank process-group world per test session (per xdist worker) for the pipelining
tests: spawning ranks costs more than most cases."""
import pytest

from support.pg_world import World


@pytest.fixture(scope="session")
def pp_world():
    w = World(4, timeout=60.0, options={"cases": ["support.pipelining_cases"], "timeout": 60})
    try:
        yield w
    finally:
        w.close()

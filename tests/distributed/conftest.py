"""One 4-rank process-group world per test session (per xdist worker), shared by the
collective and DDP tests: spawning ranks costs more than most of those tests."""
import pytest

from support.pg_world import World


@pytest.fixture(scope="session")
def pg_world():
    # small ring pieces and a low shared-memory threshold, so that modest tensors take the
    # pipelined ring, over both the socket and shared memory; 60 s for a case (and for the
    # four ranks to start): 20 s was too short for the start on a 2-core machine at a load
    # of 40-80 (every test of this directory then errs at once)
    w = World(4, timeout=60.0, options={"piece_bytes": 16 << 10, "shm_threshold": 32 << 10,
                                        "cases": ["support.pg_cases", "support.ddp_cases",
                                                  "support.dcp_cases"]})
    try:
        yield w
    finally:
        w.close()

"""SPMD tests: one function on every rank, each rank's failure under its rank, skips, sizes."""
import pytest

pytestmark = pytest.mark.timeout(120)

PASSING = '''
import pathlib, time
import pytest
from distgrad.distributed import rpc

def plus_one(x):
    return x + 1

@pytest.mark.world(3)
def test_ring(rank, world_size):
    assert rpc.get_worker_info().name == f"worker{rank}" and world_size == 3
    assert rpc.rpc_sync(f"worker{(rank + 1) % world_size}", plus_one, (rank,)) == rank + 1

@pytest.mark.world([1, 2, 4])
def test_every_size(rank, world_size):
    assert 0 <= rank < world_size and rpc.get_worker_info().id == rank

@pytest.mark.parametrize("k", [3, 5])
@pytest.mark.world(2)
def test_arguments_reach_every_rank(rank, k, tmp_path):
    (tmp_path / f".rank{rank}").write_text(str(k * rank))  # the same folder on every rank
    (tmp_path / f".rank{rank}").rename(tmp_path / f"rank{rank}")
    deadline = time.monotonic() + 10
    while not (tmp_path / "rank1").exists() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert (tmp_path / "rank1").read_text() == str(k)

class TestGroup:
    @pytest.mark.world(2)
    def test_method(self, rank):
        assert isinstance(self, TestGroup) and rank in (0, 1)
'''


def test_spmd_tests_run_on_every_rank_and_pass(example):
    result = example(PASSING, "-v")
    result.assert_outcomes(passed=7)
    result.stdout.fnmatch_lines(["*test_every_size?world1? PASSED*",
                                 "*test_every_size?world4? PASSED*"])


FAILING = '''
import time
import pytest

@pytest.mark.world(3)
def test_two_ranks_fail(rank):
    value = rank * 10
    assert value < 5

@pytest.mark.world(2)
def test_rank0_fails(rank):
    assert rank != 0

@pytest.mark.world(2)
def test_rank0_waits_for_a_failed_rank(rank):
    if rank == 1:
        raise ValueError("rank 1 gives up")
    time.sleep(60)   # waits for rank 1, which will never answer: interrupted
'''


def test_a_failure_shows_each_failing_rank_with_its_traceback(example):
    import time
    t0 = time.monotonic()
    result = example(FAILING)
    assert time.monotonic() - t0 < 30  # rank 0 was interrupted, not left to sleep 60 s
    result.assert_outcomes(failed=3)
    out = result.stdout.str()
    # ranks 1 and 2 each with pytest's rewritten assertion; rank 0 passed and is not shown
    result.stdout.fnmatch_lines([
        "*_ test_two_ranks_fail _*", "rank 1: assert 10 < 5 (and rank 2)",
        "*- rank 1: assert 10 < 5 -*", "*value = rank * 10*", "E*assert 10 < 5",
        "*- rank 2: assert 20 < 5 -*", "E*assert 20 < 5",
        "*_ test_rank0_fails _*", "*- rank 0: assert 0 != 0 -*", "*assert rank != 0*",
        "*_ test_rank0_waits_for_a_failed_rank _*",
        "*- rank 0: interrupted 1 s after rank 1 failed -*",
        "*- rank 1: ValueError: rank 1 gives up -*", "E*ValueError: rank 1 gives up",
    ])
    assert "rank 0: assert" not in out.split("test_rank0_fails")[0]
    result.stdout.fnmatch_lines(["FAILED *test_two_ranks_fail - rank 1: assert 10 < 5 (and rank 2)"])


SKIPPING = '''
import pytest

@pytest.mark.world(3)
def test_skips_on_one_rank(rank):
    if rank == 2:
        pytest.skip("no accelerator on rank 2")

@pytest.mark.world(2)
def test_needs_plain_data(rank, capsys):
    pass

def test_rank_outside_spmd(rank):
    pass
'''


def test_a_skip_on_any_rank_skips_and_misuse_is_explained(example):
    result = example(SKIPPING, "-rs")
    result.assert_outcomes(skipped=1, failed=1, errors=1)
    result.stdout.fnmatch_lines([
        "*rank is for tests marked @pytest.mark.world(size)*",
        "*argument 'capsys' (*CaptureFixture) cannot reach ranks 1..1*plain-data fixture values*",
        "SKIPPED * test_example.py:*: rank 2: no accelerator on rank 2",
    ])


HANGING = '''
import time
import pytest

def wait_forever():
    while True:
        time.sleep(0.05)

@pytest.mark.world(2, timeout=1.5)
def test_rank1_hangs(rank):
    if rank == 1:
        wait_forever()
'''


def test_a_rank_that_does_not_finish_is_shown_with_its_stacks(example):
    result = example(HANGING)
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([
        "*- rank 1: still running after * s -*",
        "*File *test_example.py*, line *in wait_forever*",
        "*pending calls of worker1: *",
    ])

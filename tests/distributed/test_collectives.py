"""Collectives of ``distgrad.distributed`` on real processes: every collective against a
NumPy reference in groups of 1, 2, 3 and 4 ranks (subsets of one 4-rank world), several
dtypes, non-contiguous and 0-d tensors, bitwise equal results on every rank; async work
handles; mismatched collectives and timeouts reported on every rank.

The ranks are spawned once per session (``conftest.py``, ``support.pg_world``); each test
posts one case that every rank runs (``support.pg_cases``).
"""
import re

import pytest

from support.pg_world import World

pytestmark = pytest.mark.timeout(120)

DTYPES = ["float32", "float64", "int64", "bool", "complex128"]


@pytest.fixture
def world(pg_world):
    return pg_world


def _same_bits(results):
    """Every rank that took part in a group got the same bits (digests per key)."""
    keys = set().union(*results)
    for key in keys:
        k = int(str(key).split("/")[0])
        digests = {results[r][key] for r in range(k)}
        assert len(digests) == 1, f"{key}: ranks disagree"


@pytest.mark.parametrize("dtype", DTYPES)
def test_all_reduce(world, dtype):
    layouts = ["plain", "scalar", "strided"] + (["large"] if dtype in ("float32", "int64")
                                                else [])
    _same_bits(world.run("all_reduce", dtype, layouts))


@pytest.mark.parametrize("dtype", ["float32", "int64"])
def test_all_reduce_by_recursive_doubling(world, dtype):
    _same_bits(world.run("all_reduce_doubling", dtype))


@pytest.mark.parametrize("dtype", ["float32", "int64", "bool", "complex128"])
def test_all_reduce_by_recursive_halving_and_doubling(world, dtype):
    _same_bits(world.run("all_reduce_halving", dtype))


@pytest.mark.parametrize("dtype", ["float32", "int64"])
def test_broadcast_and_reduce(world, dtype):
    _same_bits(world.run("broadcast", dtype, ["plain", "scalar", "strided", "large"]))
    world.run("reduce", dtype, ["plain", "strided", "large"])


@pytest.mark.parametrize("dtype", ["float32", "bool"])
def test_all_gather(world, dtype):
    _same_bits(world.run("all_gather", dtype, ["plain", "scalar", "strided", "large"]))


@pytest.mark.parametrize("dtype", ["float64", "int64"])
def test_reduce_scatter(world, dtype):
    world.run("reduce_scatter", dtype, ["plain", "scalar", "strided", "large"])


def test_gather_scatter(world):
    world.run("gather_scatter", "float32", ["plain", "scalar", "strided"])
    world.run("gather_scatter", "int64", ["large"])


def test_all_to_all(world):
    world.run("all_to_all", "float32")
    world.run("all_to_all", "int64")


def test_point_to_point(world):
    world.run("point_to_point")


def test_object_collectives(world):
    assert world.run("objects") == [{1: 1, 2: 2, 3: 3, 4: 4}, {2: 2, 3: 3, 4: 4},
                                    {3: 3, 4: 4}, {4: 4}]


def test_async_work_handles(world):
    world.run("async_ops")


def test_subgroup_ranks(world):
    assert world.run("barrier_and_ranks") == [[[0, 1], [0, 2], [0, 3], [0, 4]],
                                              [[1, 2], [1, 3], [1, 4]], [[2, 3], [2, 4]],
                                              [[3, 4]]]


CALLS = {
    "op": ["all_reduce(shape=[4], dtype=float32, op=SUM)"] * 3
    + ["broadcast(shape=[4], dtype=float32, src=0)"],
    "shape": ["all_reduce(shape=[4], dtype=float32, op=SUM)",
              "all_reduce(shape=[5], dtype=float32, op=SUM)"]
    + ["all_reduce(shape=[4], dtype=float32, op=SUM)"] * 2,
    "dtype": ["all_reduce(shape=[4], dtype=float32, op=SUM)"] * 2
    + ["all_reduce(shape=[4], dtype=float64, op=SUM)",
       "all_reduce(shape=[4], dtype=float32, op=SUM)"],
    "root": ["broadcast(shape=[4], dtype=float32, src=1)"]
    + ["broadcast(shape=[4], dtype=float32, src=0)"] * 3,
    "order": ["all_reduce(shape=[4], dtype=float32, op=SUM)"]
    + ["broadcast(shape=[4], dtype=float32, src=0)"] * 3,
}


@pytest.mark.parametrize("kind", sorted(CALLS))
def test_mismatched_collectives_fail_on_every_rank_with_what_each_called(world, kind):
    errors = world.run("mismatch", kind, timeout=15)
    for r, msg in enumerate(errors):
        assert "Detected mismatch between collectives" in msg, (r, msg)
        for rank, call in enumerate(CALLS[kind]):
            assert f"rank {rank} called {call}" in msg, (r, msg)


def test_a_silent_rank_times_out_the_others_naming_it(world):
    results = world.run("timeout", timeout=15)
    assert results[1] == "skipped"
    for r in (0, 2, 3):
        msg, elapsed = results[r]
        assert "timed out after 0.5 s" in msg and "all_reduce" in msg, msg
        assert elapsed < 5, elapsed
    # somebody waited for rank 1 itself; the others may have been told by it
    assert any(re.search(r"waiting for rank 1\b", results[r][0]) for r in (0, 2))


def test_a_rank_that_leaves_and_one_killed_in_an_all_reduce():
    w = World(4)
    try:
        # rank 3 sends to rank 0 and leaves at once: the message still arrives, then the
        # groups it belonged to report it gone
        assert w.run("send_then_leave", 0, 3, ranks=[0, 3]) == [True, True]
        # rank 2 is SIGKILLed in the middle of an all-reduce of ranks 0-2: the others fail
        # within the heartbeat bound (a killed peer is reported in ~0.2 s), naming it
        k = w.post("die_during_all_reduce", 3, 2, ranks=[0, 1, 2])
        for msg, elapsed in w.collect(k, ranks=[0, 1], timeout=20, dead={2}):
            assert "rank 2" in msg and "unreachable" in msg, msg
            assert elapsed < 3.0, elapsed
    finally:
        w.close()

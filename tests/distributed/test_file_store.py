"""FileStore: processes share a store by its file name; init_process_group meets through
one (``file://``); the file goes when the last of ``world_size`` users closes it."""
import os
import textwrap
import threading
import time
from datetime import timedelta

import pytest

import distgrad.distributed as dist
from local.programs import run_programs

pytestmark = pytest.mark.timeout(120)


def test_stores_of_one_file_share_their_keys_and_wait_for_each_other(tmp_path):
    path = str(tmp_path / "store")
    a, b = dist.FileStore(path, 2), dist.FileStore(path, 2)
    try:
        setter = threading.Timer(0.2, lambda: b.set("late", "here"))
        setter.start()
        t0 = time.monotonic()
        assert a.get("late") == b"here" and time.monotonic() - t0 >= 0.15
        assert [a.add("n", 1), b.add("n", 1)] == [1, 2]
        assert a.num_keys() == 2 and sorted(b.list_keys()) == ["late", "n"]
        a.set_timeout(timedelta(seconds=0.2))
        with pytest.raises(dist.DistStoreError, match="'never'"):
            a.get("never")
    finally:
        a.close()
        b.close()


def test_the_file_is_removed_once_world_size_users_have_closed_it(tmp_path):
    path = str(tmp_path / "store")
    first = dist.FileStore(path, 2)
    first.set("k", "v")
    first.close()   # one of two users finished: a rank that opens it late still finds it
    assert os.path.exists(path)
    second = dist.FileStore(path, 2)
    assert second.get("k") == b"v"
    second.close()
    assert not os.path.exists(path)
    unbounded = dist.FileStore(path)   # world_size -1: never removed (as PyTorch)
    unbounded.close()
    assert os.path.exists(path)
    with pytest.raises(dist.DistStoreError, match="closed"):
        unbounded.get("k")


def test_a_file_that_is_not_a_store_is_named(tmp_path):
    path = tmp_path / "notes.txt"
    path.write_bytes(b"\xc1 not msgpack")
    with pytest.raises(dist.DistStoreError, match="notes.txt.*does not hold a store"):
        dist.FileStore(str(path))
    with pytest.raises(ValueError, match="file_name"):
        dist.FileStore("")


RANK = textwrap.dedent("""
    import sys
    import distgrad
    import distgrad.distributed as dist
    rank = int(sys.argv[1])
    dist.init_process_group("gloo", init_method="file://" + sys.argv[2], rank=rank,
                            world_size=2, timeout=__import__("datetime").timedelta(seconds=30))
    t = distgrad.tensor([float(rank + 1)])
    dist.all_reduce(t)
    print("sum", t.item(), flush=True)
    dist.destroy_process_group()
""")


def test_init_process_group_meets_through_a_file(tmp_path):
    path = str(tmp_path / "rendezvous")
    for code, out, err in run_programs([(RANK, r, path) for r in range(2)]):
        assert code == 0, err
        assert "sum 3.0" in out
    assert not os.path.exists(path)  # both ranks closed it


def test_file_init_method_needs_rank_and_world_size(tmp_path):
    with pytest.raises(ValueError, match="file:// init_method needs rank and world_size"):
        dist.init_process_group("gloo", init_method=f"file://{tmp_path}/x")
    with pytest.raises(ValueError, match="names no file"):
        dist.init_process_group("gloo", init_method="file://", rank=0, world_size=1)


ADDER = textwrap.dedent("""
    import sys
    import distgrad.distributed as dist
    store = dist.FileStore(sys.argv[1], 3)
    for _ in range(100):
        store.add("count", 1)
    store.wait(["count"])
    store.close()
""")


def test_concurrent_adds_from_processes_are_not_lost(tmp_path):
    path = str(tmp_path / "counter")
    watcher = dist.FileStore(path)  # world_size -1: keeps the file for the check
    results = run_programs([(ADDER, path)] * 3)
    assert [code for code, _, _ in results] == [0, 0, 0], results
    assert watcher.get("count") == b"300"
    watcher.close()


def test_a_file_an_earlier_run_left_behind_is_named(tmp_path):
    path = str(tmp_path / "stale")
    earlier = dist.FileStore(path, 2)  # a run that crashed: it never closed its store
    dist.PrefixStore("distgrad_pg/default", earlier).add("rank/0", 1)
    with pytest.raises(dist.DistError, match=r"rank 0 was claimed by 2 processes .*the file "
                                             r".*stale'? was left behind by an earlier run"):
        dist.init_process_group("gloo", init_method=f"file://{path}", rank=0, world_size=2,
                                timeout=timedelta(seconds=5))
    assert not dist.is_initialized()
    earlier._close_fd()

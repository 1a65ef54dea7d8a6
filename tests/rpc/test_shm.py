"""The same-host shared-memory path: every kind of array arrives equal and read-only,
segments are reused and freed, and a killed process leaves nothing the next one keeps."""
import glob
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from distgrad.distributed import rpc
from distgrad.rpc import current_agent
from distgrad.rpc.shm import SegmentMaps, SegmentPool, shm_root
from support import rpc_funcs as f

pytestmark = [pytest.mark.timeout(90),
              pytest.mark.skipif(shm_root() is None, reason="no /dev/shm on this machine")]

THRESHOLD = 64 * 1024


def _segments(pid):
    return glob.glob(os.path.join(shm_root(), f"dgshm-{pid}-*"))


def _wait_probed():
    """Probes are made on first need: one large array each way, then both handshakes done."""
    big = np.zeros(THRESHOLD // 8, np.float64)
    np.testing.assert_array_equal(rpc.rpc_sync("worker1", f.echo, (big,)), big)
    deadline = time.monotonic() + 10
    while not (1 in current_agent().shm.peers
               and 0 in rpc.rpc_sync("worker1", f.shm_stats)["peers"]) \
            and time.monotonic() < deadline:
        time.sleep(0.02)
    assert 1 in current_agent().shm.peers, "the shared-memory handshake did not complete"
    assert 0 in rpc.rpc_sync("worker1", f.shm_stats)["peers"], "nor the worker's"


def _wait_returned():
    """Wait until the peer has given back every segment lent to it."""
    deadline = time.monotonic() + 10
    while current_agent().shm.stats()["lent"] and time.monotonic() < deadline:
        time.sleep(0.005)
    assert current_agent().shm.stats()["lent"] == 0, "a segment was never given back"


ARRAYS = [
    np.arange(THRESHOLD, dtype=np.float64).reshape(256, -1),          # above, 2-D
    np.arange(THRESHOLD * 2, dtype=np.float32)[::2],                  # non-contiguous
    np.arange(100, dtype=np.int64),                                    # below the threshold
    np.array(3.5),                                                     # 0-d
    (np.arange(THRESHOLD, dtype=np.float64) * (1 + 2j)).astype(np.complex128),
    np.arange(THRESHOLD * 8) % 3 == 0,                                 # bool
    np.zeros((0, 7), np.float32),                                      # empty
]


@pytest.mark.parametrize("i", range(len(ARRAYS)))
def test_arrays_arrive_equal_and_read_only_both_ways(rpc_world, i):
    rpc_world(1, shm_threshold=THRESHOLD)
    _wait_probed()
    a = ARRAYS[i]
    back = rpc.rpc_sync("worker1", f.echo, (a,))
    np.testing.assert_array_equal(back, a)
    assert back.dtype == a.dtype and back.shape == a.shape and not back.flags.writeable
    dt, shape, contiguous, values = rpc.rpc_sync("worker1", f.describe_array, (a,))
    assert (dt, tuple(shape)) == (a.dtype.str, a.shape) and contiguous
    assert np.array_equal(np.array(values, dtype=a.dtype).reshape(a.shape), a)


def test_segments_are_reused_released_and_removed(rpc_world):
    world = rpc_world(1, shm_threshold=THRESHOLD)
    _wait_probed()
    a = np.ones(1 << 20, np.float32)
    for _ in range(20):
        assert rpc.rpc_sync("worker1", f.sum_array, (a,)) == float(1 << 20)
        _wait_returned()  # the release travels apart from the reply: it may come later
    mine = current_agent().shm.stats()
    assert mine["segments"] == 1, mine  # reused, not one per message
    wpid = world.procs["worker1"].pid
    for _ in range(5):
        back = rpc.rpc_sync("worker1", f.echo, (a,))  # the reply comes through the worker's pool
    del back
    assert _segments(os.getpid()) and _segments(wpid)
    rpc.shutdown()
    world.procs["worker1"].wait(10)
    assert not _segments(os.getpid()) and not _segments(wpid)


def test_a_killed_receiver_gives_its_segments_back(rpc_world):
    world = rpc_world(1, shm_threshold=THRESHOLD)
    _wait_probed()
    for i in range(3):  # the worker keeps what it received: the segments stay lent to it
        rpc.rpc_sync("worker1", f.keep, (i, np.ones(1 << 18, np.float32)))
    assert current_agent().shm.stats()["lent"] == 3
    world.kill("worker1")
    _wait_returned()


def test_a_killed_sender_leaves_nothing_the_next_process_keeps(tmp_path):
    code = ("import os, sys, numpy as np\n"
            "from distgrad.rpc.shm import SegmentPool, shm_root\n"
            "pool = SegmentPool(shm_root(), 1024, 1 << 24)\n"
            "pool.lend(np.ones(1 << 16, np.float32), 1)\n"
            "print(os.getpid(), flush=True)\n"
            "os.kill(os.getpid(), 9)\n")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    dead = int(p.stdout.split()[0])
    assert _segments(dead), "the killed process left its segment (as a crash does)"
    SegmentPool(shm_root(), 1024, 1 << 20).close()  # the next process to start sweeps it
    assert not _segments(dead)


def test_a_receiver_maps_only_what_the_sender_proved_it_may_lend(tmp_path):
    pool = SegmentPool(shm_root(), 1024, 1 << 22)
    released = []
    maps = SegmentMaps(shm_root(), lambda src, names: released.extend(names), 1 << 22)
    try:
        name, token = pool.probe()
        assert not maps.check_probe(1, os.getpid() + 1, name, token)  # another pid's name
        assert not maps.check_probe(1, os.getpid(), name, "wrong")
        assert maps.check_probe(1, os.getpid(), name, token)
        pool.end_probe(name)
        seg = pool.lend(np.arange(1000, dtype=np.float64), dst=1)
        with pytest.raises(ValueError):
            maps.view(seg, 8000, src=2)  # rank 2 proved nothing
        with pytest.raises(ValueError):
            maps.view("../" + seg, 8000, src=1)
        v = maps.view(seg, 8000, src=1)
        np.testing.assert_array_equal(v.view(np.float64), np.arange(1000.0))
        del v
        assert released == [seg]
    finally:
        pool.close()
        maps.close()


def test_the_socket_path_when_shared_memory_is_off(rpc_world):
    rpc_world(1, shm_threshold=0)
    a = np.arange(1 << 18, dtype=np.float32)
    np.testing.assert_array_equal(rpc.rpc_sync("worker1", f.echo, (a,)), a)
    assert not current_agent().shm.on and not _segments(os.getpid())


@pytest.mark.parametrize("replies_first", [0, 5])
def test_sigkill_of_a_sender_mid_message(rpc_world, replies_first):
    """A worker killed while its replies (through shared memory) are on the way: some
    arrived (their arrays stay mapped until the test's frame is collected: the failed
    Futures' errors hold it in a cycle), the rest fail."""
    world = rpc_world(1, shm_threshold=THRESHOLD)
    _wait_probed()
    wpid = world.procs["worker1"].pid
    futs = [rpc.rpc_async("worker1", f.make_array, (1 << 18,)) for _ in range(20)]
    if replies_first:
        assert futs[replies_first - 1].wait_done(30)
    os.kill(wpid, signal.SIGKILL)
    got = 0
    for fut in futs:
        try:
            got += int(fut.wait(10).size == 1 << 18)
        except rpc.WorkerUnreachableError:
            pass
    world.procs["worker1"].wait(10)
    SegmentPool(shm_root(), 1024, 1 << 20).close()  # the next process sweeps
    assert not _segments(wpid)


def _eventfds():
    out = set()
    for n in os.listdir("/proc/self/fd"):
        try:
            if os.readlink(f"/proc/self/fd/{n}") == "anon_inode:[eventfd]":
                out.add(int(n))
        except OSError:
            pass
    return out


@pytest.mark.skipif(not hasattr(os, "eventfd"), reason="needs eventfd (Linux)")
def test_an_array_that_outlives_its_world_stays_valid_and_writes_to_no_file(rpc_world):
    """Freeing a view of a peer's segment queues a release and wakes the I/O thread. Once
    the world closed, that wake-up's descriptor number belongs to another file: the
    release must write nothing there (it wrote 8 bytes into whatever reused the number)."""
    world = rpc_world(1, shm_threshold=THRESHOLD)
    _wait_probed()
    a = rpc.rpc_sync("worker1", f.make_array, (1 << 18, 2.0))
    ours = _eventfds()
    rpc.shutdown()
    world.procs["worker1"].wait(10)
    assert float(a.sum()) == 2.0 * (1 << 18)  # the mapping outlives the world
    freed = ours - _eventfds()  # the world's wake-up among them
    assert freed
    reused = []
    try:
        while not freed <= set(reused) and len(reused) < 4096:  # take every freed number
            reused.append(os.eventfd(0, os.EFD_NONBLOCK))
        assert freed <= set(reused)
        del a  # the last view goes: its release has nobody to go to
        for fd in reused:
            with pytest.raises(BlockingIOError):
                os.read(fd, 8)
    finally:
        for fd in reused:
            os.close(fd)

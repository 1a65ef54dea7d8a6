"""A rank killed (SIGKILL) in the middle of a save leaves the checkpoint that was there
loadable: the save's metadata is written last and atomically, and its data files never
overwrite the committed ones. Its own world of two ranks: the test kills one."""
import os
import signal
import time
import warnings

import numpy as np
import pytest

import distgrad
import distgrad.distributed.checkpoint as dcp
from support.pg_world import World

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def pair():
    w = World(2, options={"cases": ["support.pg_cases", "support.dcp_cases"], "timeout": 20})
    try:
        yield w
    finally:
        w.close()


def _load(path):
    sd = {"w": distgrad.zeros(64), "v": distgrad.zeros(8)}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "assuming the intent is to load in a single process"
        dcp.load(sd, checkpoint_id=path)
    return float(sd["w"].numpy()[0]), float(sd["v"].numpy()[0])


def _kill_rank1_mid_save(pair, path, value):
    k = pair.post("save_then_die", path, value, ranks=[0, 1])
    key = f"dcp-writing/{path}"
    deadline = time.monotonic() + 30
    while not pair.store.check([key]):
        assert time.monotonic() < deadline, "rank 1 never started writing"
        assert pair.processes[1].is_alive()
        time.sleep(0.02)
    os.kill(pair.processes[1].pid, signal.SIGKILL)
    pair.processes[1].join(10)
    # rank 0 does not wait for ever: it learns that rank 1 is gone
    (r0,) = pair.collect(k, ranks=[0], timeout=60, dead=[1])
    return r0


def test_a_rank_killed_mid_save_over_a_checkpoint_leaves_it_loadable(pair, tmp_path):
    path = str(tmp_path / "ckpt")
    pair.run("save_values", path, 1.0, ranks=[0, 1])
    before = sorted(os.listdir(path))
    r0 = _kill_rank1_mid_save(pair, path, 2.0)
    assert r0[0] == "raised", r0
    assert _load(path) == (1.0, 1.0)   # the old checkpoint, whole
    # the dead save's files are there, unnamed; the next complete save removes them
    assert set(before) <= set(os.listdir(path))


def test_a_rank_killed_mid_save_to_a_new_directory_leaves_no_checkpoint(pair, tmp_path):
    old, new = str(tmp_path / "step-1"), str(tmp_path / "step-2")
    pair.run("save_values", old, 1.0, ranks=[0, 1])
    r0 = _kill_rank1_mid_save(pair, new, 2.0)
    assert r0[0] == "raised"
    assert not os.path.exists(os.path.join(new, ".metadata"))
    with pytest.raises(dcp.CheckpointException, match="no complete checkpoint"):
        _load(new)
    assert _load(old) == (1.0, 1.0)


def test_the_next_complete_save_removes_what_the_killed_one_left(tmp_path):
    """One process: files of an unfinished save (no metadata names them) go at the next commit."""
    path = tmp_path / "ckpt"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.save({"w": distgrad.ones(4)}, checkpoint_id=path)
        (path / "__1_0-0123456789abcdef.distcp").write_bytes(b"half a file")
        dcp.save({"w": distgrad.ones(4) * 3}, checkpoint_id=path)
    files = sorted(os.listdir(path))
    assert len(files) == 2 and files[0] == ".metadata"
    sd = {"w": distgrad.zeros(4)}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.load(sd, checkpoint_id=path)
    np.testing.assert_array_equal(sd["w"].numpy(), [3.0] * 4)

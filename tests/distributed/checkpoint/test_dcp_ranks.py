"""Distributed checkpoints on the ranks of the session's world (tests/distributed/conftest.py):
a DDP model and its Adam state saved by 2 ranks load onto 2, 3 and 4 ranks and into
this one process; each rank writes its own file; a failure on one rank reaches every
rank; rank-local checkpoints refuse another world size; async_save stages a copy; the
same training saved with PyTorch's DCP has the same keys, file layout and values."""
import os
import uuid
import warnings

import numpy as np
import pytest

import distgrad
import distgrad.distributed.checkpoint as dcp
from distgrad.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from support import dcp_cases

pytestmark = pytest.mark.timeout(120)


def _load_here(path):
    """Load the checkpoint in this process (no process group) into a bare model."""
    model = dcp_cases.mlp(7)
    optim = distgrad.optim.Adam(model.parameters(), lr=0.01)
    msd, osd = get_state_dict(model, optim)
    state = {"model": msd, "optim": osd, "extra": {"step": -1}}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "assuming the intent is to load in a single process"
        dcp.load(state, checkpoint_id=path)
    set_state_dict(model, optim, model_state_dict=state["model"], optim_state_dict=state["optim"])
    return dcp_cases.digests(*get_state_dict(model, optim)), state["extra"]


@pytest.fixture(scope="module")
def saved(pg_world, tmp_path_factory):
    """A checkpoint of 2 ranks, and what each rank saved."""
    path = str(tmp_path_factory.mktemp("dcp") / "ckpt")
    return path, pg_world.run("save_trained", path, 2, ranks=[0, 1])


def test_two_ranks_save_identical_state_each_to_its_own_file(saved):
    path, (r0, r1) = saved
    assert r0["digests"] == r1["digests"]  # DDP: both ranks hold the same state
    data = sorted(f for f in os.listdir(path) if f.endswith(".distcp"))
    assert [f.split("_")[2] for f in data] == ["0", "1"]  # __0_0-..., __1_0-...
    # replicated values are written once: the two files share the bytes about evenly
    sizes = [os.path.getsize(os.path.join(path, f)) for f in data]
    assert min(sizes) > 0.25 * sum(sizes)
    assert ".metadata" in os.listdir(path)


@pytest.mark.parametrize("n", [2, 3, 4])
def test_a_two_rank_checkpoint_loads_onto_n_ranks(pg_world, saved, n):
    path, (r0, _) = saved
    for got in pg_world.run("load_into_fresh", path, n, ranks=list(range(n))):
        assert got["digests"] == r0["digests"]
        assert got["extra"] == {"step": 2}


def test_a_two_rank_checkpoint_loads_into_one_process_without_a_group(saved):
    path, (r0, _) = saved
    got, extra = _load_here(path)
    assert got == r0["digests"] and extra == {"step": 2}


def test_four_ranks_save_and_two_load(pg_world, tmp_path):
    path = str(tmp_path / "ckpt4")
    saved = pg_world.run("save_trained", path, 4)
    assert len({str(s["digests"]) for s in saved}) == 1
    assert len([f for f in os.listdir(path) if f.endswith(".distcp")]) == 4
    for got in pg_world.run("load_into_fresh", path, 2, ranks=[0, 1]):
        assert got["digests"] == saved[0]["digests"]


def test_a_failure_on_one_rank_raises_checkpoint_exception_on_every_rank(pg_world, tmp_path):
    for got in pg_world.run("fail_on_one_rank", str(tmp_path / "c"), ranks=[0, 1]):
        assert got["ranks"] == [1] and got["kinds"] == ["ValueError"]
        assert "no plan on rank 1" in got["text"]
    assert not os.path.exists(tmp_path / "c" / ".metadata")


def test_rank_local_checkpoints_load_on_their_ranks_and_refuse_more(pg_world, tmp_path):
    path = str(tmp_path / "local")
    files = pg_world.run("save_rank_local", path, 2, ranks=[0, 1])[0]
    assert "__0.metadata" in files and "__1.metadata" in files and ".metadata" not in files
    assert pg_world.run("load_rank_local", path, 2, ranks=[0, 1]) == [["ok", [0.0] * 3],
                                                                     ["ok", [1.0] * 3]]
    for kind, text in pg_world.run("load_rank_local", path, 3, ranks=[0, 1, 2]):
        assert kind == "error"
        assert "saved without collectives by ranks [0, 1]" in text


def test_async_save_saves_the_values_of_the_call(pg_world, tmp_path):
    path = str(tmp_path / "async")
    r0, r1 = pg_world.run("async_save_and_mutate", path, ranks=[0, 1])
    assert r0["digests"] == r1["digests"] and r0["keys"] > 0
    assert _load_here_model_only(path) == \
        {k: v for k, v in r0["digests"].items() if k.startswith("model.")}


def _load_here_model_only(path):
    model = dcp_cases.mlp(7)
    sd = {"model": model.state_dict()}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.load(sd, checkpoint_id=path)
    return dcp_cases.digests(sd["model"], {})


def test_same_training_saved_by_torch_dcp_has_our_keys_layout_and_values(pg_world, tmp_path):
    pytest.importorskip("torch")
    r0, r1 = pg_world.run("dcp_against_torch", str(tmp_path / "ours"), str(tmp_path / "theirs"),
                          f"torch-port-{uuid.uuid4().hex}", ranks=[0, 1], timeout=90)
    for got in (r0, r1):
        assert got["our_keys"] == got["their_keys"]
        assert got["same_after_load"]
        assert got["err"] < 1e-5
        ours = [f.split("-")[0] for f in got["our_files"] if f.endswith(".distcp")]
        theirs = [f.removesuffix(".distcp") for f in got["their_files"] if f.endswith(".distcp")]
        assert ours == theirs == ["__0_0", "__1_0"]

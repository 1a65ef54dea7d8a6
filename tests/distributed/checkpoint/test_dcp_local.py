"""Distributed checkpoints in one process (no process group), next to PyTorch's DCP where
it is installed: the same state dicts give the same checkpoint keys, the same calls of
Stateful objects and planners, the same in-place filling, the same errors."""
import concurrent.futures
import os
import warnings

import numpy as np
import pytest

import distgrad
import distgrad.distributed.checkpoint as dcp
from distgrad.distributed.checkpoint.format_utils import dcp_to_torch_save, torch_save_to_dcp
from distgrad.distributed.checkpoint.state_dict import (StateDictOptions, get_model_state_dict,
                                                        get_optimizer_state_dict, get_state_dict,
                                                        set_state_dict)

pytestmark = [pytest.mark.timeout(60),
              pytest.mark.filterwarnings("ignore:torch.distributed is disabled"),
              pytest.mark.filterwarnings("ignore:Detected an existing checkpoint")]


class Lib:
    """One library's names: distgrad's, or torch's for the same test."""

    def __init__(self, name):
        if name == "distgrad":
            self.t, self.dcp, self.nn, self.optim = distgrad, dcp, distgrad.nn, distgrad.optim
            from distgrad.distributed.checkpoint import state_dict
        else:
            torch = pytest.importorskip("torch")
            import torch.distributed.checkpoint as tdcp
            from torch.distributed.checkpoint import state_dict
            self.t, self.dcp, self.nn, self.optim = torch, tdcp, torch.nn, torch.optim
        self.sd = state_dict

    def arr(self, x):
        return self.t.tensor(np.asarray(x, dtype=np.float32))


@pytest.fixture(params=["distgrad", "torch"])
def lib(request):
    return Lib(request.param)


def nested(L):
    return {"a": {"b": L.arr([1, 2, 3]), "c": [L.arr([4.0]), L.arr([5.0, 6.0])],
                  "d": (1, 2), "e": [1, 2]}, "n": 3, "s": "text"}


def test_nested_state_dicts_flatten_to_the_same_keys(lib, tmp_path):
    md = lib.dcp.save(nested(lib), checkpoint_id=tmp_path)
    kinds = {k: type(v).__name__ for k, v in md.state_dict_metadata.items()}
    assert kinds == {"a.b": "TensorStorageMetadata", "a.c.0": "TensorStorageMetadata",
                     "a.c.1": "TensorStorageMetadata", "a.d": "BytesStorageMetadata",
                     "a.e": "BytesStorageMetadata", "n": "BytesStorageMetadata",
                     "s": "BytesStorageMetadata"}
    assert {k: tuple(v) for k, v in md.planner_data.items()}["a.c.1"] == ("a", "c", 1)


def test_load_fills_tensors_in_place_and_replaces_other_values(lib, tmp_path):
    lib.dcp.save(nested(lib), checkpoint_id=tmp_path)
    target = {"a": {"b": lib.arr([0, 0, 0]), "c": [lib.arr([0.0]), lib.arr([0.0, 0.0])],
                    "d": None, "e": None}, "n": 0, "s": ""}
    b = target["a"]["b"]
    lib.dcp.load(target, checkpoint_id=tmp_path)
    assert target["a"]["b"] is b and b.tolist() == [1, 2, 3]
    assert target["a"]["c"][1].tolist() == [5.0, 6.0]
    assert (target["n"], target["s"], tuple(target["a"]["d"]), list(target["a"]["e"])) == \
        (3, "text", (1, 2), [1, 2])


class Recorder:
    """A Stateful object that records the calls DCP makes of it."""

    def __init__(self, L, value):
        self.L, self.calls, self.w = L, [], L.arr([value] * 2)

    def state_dict(self):
        self.calls.append("state_dict")
        return {"w": self.w, "k": 1}

    def load_state_dict(self, sd):
        self.calls.append("load_state_dict")
        self.loaded = sd


def test_stateful_objects_are_called_as_pytorch_calls_them(lib, tmp_path):
    saver = Recorder(lib, 1.0)
    lib.dcp.save({"obj": saver}, checkpoint_id=tmp_path)
    loader = Recorder(lib, 0.0)
    lib.dcp.load({"obj": loader}, checkpoint_id=tmp_path)
    assert saver.calls == ["state_dict"]
    assert loader.calls == ["state_dict", "load_state_dict"]
    assert loader.loaded["w"].tolist() == [1.0, 1.0] and loader.loaded["k"] == 1
    assert isinstance(saver, lib.dcp.stateful.Stateful)


def _error(fn):
    try:
        fn()
    except BaseException as e:  # noqa: BLE001 - CheckpointException is a BaseException
        if isinstance(e, KeyboardInterrupt):
            raise
        return type(e).__name__, str(e)
    return None, ""


@pytest.mark.parametrize("case", ["missing_key", "size_mismatch", "no_checkpoint", "no_id",
                                  "no_overwrite"])
def test_errors_have_pytorch_classes(case, tmp_path):
    results = {}
    for name in ("distgrad", "torch"):
        L = Lib(name)
        path = tmp_path / name
        L.dcp.save({"x": L.arr([1, 2])}, checkpoint_id=path)
        run = {
            "missing_key": lambda: L.dcp.load({"x": L.arr([0, 0]), "y": L.arr([0])},
                                              checkpoint_id=path),
            "size_mismatch": lambda: L.dcp.load({"x": L.arr([0, 0, 0])}, checkpoint_id=path),
            "no_checkpoint": lambda: L.dcp.load({"x": L.arr([0, 0])},
                                                checkpoint_id=tmp_path / "nothing"),
            "no_id": lambda: L.dcp.save({"x": L.arr([0])}),
            "no_overwrite": lambda: L.dcp.save({"x": L.arr([0])}, storage_writer=L.dcp.
                                               FileSystemWriter(path, overwrite=False)),
        }[case]
        results[name] = _error(run)
    assert results["distgrad"][0] == results["torch"][0] is not None
    words = {"missing_key": "Missing key in checkpoint state_dict: y",
             "size_mismatch": "Size mismatch", "no_checkpoint": "the directory does not exist",
             "no_id": "`checkpoint_id` must be specified", "no_overwrite": "already exists"}
    assert words[case] in results["distgrad"][1]


def test_partial_loads_leave_missing_keys_alone(lib, tmp_path):
    lib.dcp.save({"x": lib.arr([1, 2])}, checkpoint_id=tmp_path)
    sd = {"x": lib.arr([0, 0]), "y": lib.arr([9])}
    lib.dcp.load(sd, checkpoint_id=tmp_path,
                 planner=lib.dcp.DefaultLoadPlanner(allow_partial_load=True))
    assert sd["x"].tolist() == [1, 2] and sd["y"].tolist() == [9]


def test_planner_subclasses_see_every_item(lib, tmp_path):
    class Renaming(lib.dcp.DefaultSavePlanner):
        """Saves every key with a prefix (the planner hooks users override)."""

        def set_up_planner(self, state_dict, storage_meta=None, is_coordinator=False):
            super().set_up_planner({f"v1.{k}": v for k, v in state_dict.items()},
                                   storage_meta, is_coordinator)

    class Counting(lib.dcp.DefaultLoadPlanner):
        def __init__(self):
            super().__init__()
            self.committed = []

        def commit_tensor(self, read_item, tensor):
            self.committed.append(read_item.dest_index.fqn)

    md = lib.dcp.save({"x": lib.arr([1, 2]), "n": 4}, checkpoint_id=tmp_path,
                      planner=Renaming())
    assert sorted(md.state_dict_metadata) == ["v1.n", "v1.x"]
    planner = Counting()
    sd = {"v1": {"x": lib.arr([0, 0]), "n": 0}}
    lib.dcp.load(sd, checkpoint_id=tmp_path, planner=planner)
    assert planner.committed == ["v1.x"] and sd["v1"]["x"].tolist() == [1, 2]
    assert sd["v1"]["n"] == 4


def test_async_save_returns_a_future_of_the_metadata(lib, tmp_path):
    x = lib.arr([1, 2])
    future = lib.dcp.async_save({"x": x}, checkpoint_id=tmp_path)
    assert isinstance(future, concurrent.futures.Future)
    md = future.result(timeout=30)
    assert sorted(md.state_dict_metadata) == ["x"]


def test_async_save_refuses_a_separate_process():
    with pytest.raises(NotImplementedError, match="PROCESS"):
        dcp.async_save({"x": distgrad.ones(1)}, checkpoint_id="unused",
                       async_checkpointer_type=dcp.AsyncCheckpointerType.PROCESS)


def test_no_pickle_in_the_checkpoint(tmp_path):
    dcp.save(nested(Lib("distgrad")), checkpoint_id=tmp_path)
    for name in os.listdir(tmp_path):
        assert b"\x80\x04\x95" not in (tmp_path / name).read_bytes()  # pickle protocol 4


def test_dcp_and_distgrad_save_files_convert_both_ways(tmp_path):
    model = distgrad.nn.Linear(3, 2)
    dcp.save({"model": model, "step": 7}, checkpoint_id=tmp_path / "ckpt")
    dcp_to_torch_save(tmp_path / "ckpt", tmp_path / "whole.pt")
    whole = distgrad.load(tmp_path / "whole.pt")
    assert whole["step"] == 7
    np.testing.assert_array_equal(whole["model"]["weight"].numpy(), model.weight.detach().numpy())
    torch_save_to_dcp(tmp_path / "whole.pt", tmp_path / "again")
    other = distgrad.nn.Linear(3, 2)
    dcp.load({"model": other}, checkpoint_id=tmp_path / "again")
    np.testing.assert_array_equal(other.weight.detach().numpy(), model.weight.detach().numpy())


# ---------------------------------------------------------------- state_dict helpers
def _model(L):
    net = L.nn.Sequential(L.nn.Linear(3, 4), L.nn.ReLU(), L.nn.Linear(4, 2))
    net[0].bias.requires_grad_(False)
    return net, L.optim.Adam([p for p in net.parameters() if p.requires_grad], lr=0.1)


@pytest.mark.parametrize("options", [{}, {"ignore_frozen_params": True},
                                     {"flatten_optimizer_state_dict": True}])
def test_state_dict_helpers_give_pytorchs_keys(options):
    keys = {}
    for name in ("distgrad", "torch"):
        L = Lib(name)
        net, opt = _model(L)
        msd, osd = L.sd.get_state_dict(net, opt, options=L.sd.StateDictOptions(**options))
        if "state" in osd:
            osd = {"state": sorted(osd["state"]), "groups": [g["params"] for g in
                                                             osd["param_groups"]]}
        keys[name] = (sorted(msd), sorted(osd) if isinstance(osd, dict) and "state" not in osd
                      else osd)
    assert keys["distgrad"] == keys["torch"]


def test_optimizer_state_follows_parameter_names_into_another_layout():
    net, opt = _model(Lib("distgrad"))
    net(distgrad.ones(2, 3)).sum().backward()
    opt.step()
    osd = get_optimizer_state_dict(net, opt)
    other, _ = _model(Lib("distgrad"))
    # one group per layer: positions differ, names do not
    opt2 = distgrad.optim.Adam([{"params": [other[2].weight, other[2].bias]},
                                {"params": [other[0].weight], "lr": 0.5}], lr=0.5)
    set_state_dict(other, opt2, model_state_dict=get_model_state_dict(net),
                   optim_state_dict=osd)
    np.testing.assert_array_equal(opt2.state[other[0].weight]["exp_avg"].numpy(),
                                  opt.state[net[0].weight]["exp_avg"].numpy())
    assert [g["lr"] for g in opt2.param_groups] == [0.1, 0.1]


def test_missing_optimizer_state_is_an_error_unless_not_strict():
    net, opt = _model(Lib("distgrad"))
    osd = get_optimizer_state_dict(net, opt)
    del osd["state"]["2.bias"]
    with pytest.raises(RuntimeError, match="Missing optimizer state for parameter '2.bias'"):
        set_state_dict(net, opt, model_state_dict={}, optim_state_dict=osd)
    set_state_dict(net, opt, model_state_dict={}, optim_state_dict=osd,
                   options=StateDictOptions(strict=False))


def test_broadcast_from_rank0_needs_a_full_state_dict():
    net, opt = _model(Lib("distgrad"))
    with pytest.raises(ValueError, match="full_state_dict must be True"):
        get_state_dict(net, opt, options=StateDictOptions(broadcast_from_rank0=True))


def test_a_key_with_different_tensors_on_two_ranks_is_refused():
    """Deduplication keeps one copy of a key saved by several ranks: when the copies
    differ in shape or dtype it is not replicated state, and keeping one would be wrong."""
    from distgrad.distributed.checkpoint.default_planner import (create_default_local_save_plan,
                                                                 dedup_save_plans)
    plans = [create_default_local_save_plan({"x": distgrad.ones(3)}, True),
             create_default_local_save_plan({"x": distgrad.ones(4)}, False)]
    with pytest.raises(ValueError, match="'x' differs between ranks 0 and 1"):
        dedup_save_plans(plans)
    same = [create_default_local_save_plan({"x": distgrad.ones(3)}, k == 0) for k in range(2)]
    assert [len(p.items) for p in dedup_save_plans(same)] == [1, 0]

"""A ``distgrad launch`` checkpoint read through the distributed checkpoint API: the
stages' files load into the whole model (and its optimizer) in one process, with the
values each stage wrote."""
import warnings

import numpy as np
import pytest

import distgrad
import distgrad.distributed.checkpoint as dcp
from distgrad.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from distgrad.launch import checkpoint as ckpt
from distgrad.launch.dcp_reader import LaunchCheckpointReader
from distgrad.launch.models import mlp

pytestmark = pytest.mark.timeout(120)


def test_a_launch_checkpoint_loads_into_the_whole_model(launcher, tiny_config):
    launch = launcher(tiny_config, "checkpoint.every=3", "optim.name=Adam")
    assert launch.wait() == 0, launch.output
    directory, manifest = ckpt.latest(launch.run_dir)
    assert manifest["step"] == 6 and manifest["stages"] == 2

    model = mlp([2, 8, 8, 2])
    optim = distgrad.optim.Adam(model.parameters(), lr=0.05)
    msd, osd = get_state_dict(model, optim)
    state = {"model": msd, "optim": osd, "step": 0}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "assuming the intent is to load in a single process"
        dcp.load(state, storage_reader=LaunchCheckpointReader(launch.run_dir))
    set_state_dict(model, optim, model_state_dict=state["model"], optim_state_dict=state["optim"])
    assert state["step"] == 6

    for k in range(2):
        stage = distgrad.load(ckpt.stage_path(directory, k))
        for name, value in stage["model"].items():
            np.testing.assert_array_equal(model.state_dict()[name].numpy(), value.numpy())
        params = dict(model.named_parameters())
        for i, name in enumerate(stage["param_names"]):
            saved = stage["optimizer"]["state"][i]
            np.testing.assert_array_equal(optim.state[params[name]]["exp_avg"].numpy(),
                                          saved["exp_avg"].numpy())


def test_a_directory_without_a_complete_checkpoint_is_refused(tmp_path):
    with pytest.raises(dcp.CheckpointException, match="neither a complete launch checkpoint"):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            dcp.load({"step": 0}, storage_reader=LaunchCheckpointReader(tmp_path))

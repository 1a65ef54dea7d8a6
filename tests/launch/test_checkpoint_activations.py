"""``model.checkpoint_activations``: stages that keep only their input (or each layer's)
and rerun their layers in backward train exactly as stages that keep everything: the
same losses, bit for bit, under the pipeline strategy (with micro-batches and offloading)
and under distributed autograd."""
import pytest

pytest.importorskip("zmq")
pytest.importorskip("msgpack")

from distgrad.launch.activations import checkpointed  # noqa: E402
from distgrad.launch.config import ConfigError, load_config  # noqa: E402
from distgrad.launch.models import mlp  # noqa: E402

from launch_support import reference  # noqa: E402

pytestmark = pytest.mark.timeout(120)


@pytest.mark.parametrize("overrides, offload", [
    (["model.checkpoint_activations=stage", "pipeline.micro_batches=2"], True),
    (["model.checkpoint_activations=layer", "world.strategy=autograd"], False),
], ids=["pipeline-stage-offloaded", "autograd-layer"])
def test_checkpointed_stages_train_like_stages_that_keep_everything(launcher, tiny_config,
                                                                    overrides, offload, tmp_path):
    config = tmp_path / "checkpointed.toml"
    config.write_text(tiny_config.read_text() + (
        f'[offload]\nkind = "disk"\ndirectory = "{tmp_path}"\n[offload.policy]\n'
        'min_bytes = 0\n' if offload else ""))
    launch = launcher(config, *overrides)
    assert launch.wait() == 0, launch.output
    plain = [o for o in overrides if "checkpoint_activations" not in o]
    assert launch.losses() == reference(config, plain)  # bit for bit, the same config unwrapped


def test_the_key_is_checked_and_keeps_parameter_names(tiny_config):
    assert load_config(tiny_config)["model"]["checkpoint_activations"] == "none"
    with pytest.raises(ConfigError, match="model.checkpoint_activations: must be one of 'none', "
                                          "'stage', 'layer', got 'all'"):
        load_config(tiny_config, ["model.checkpoint_activations=all"])
    stage = mlp([2, 8, 8, 2])[2:]
    for mode in ("stage", "layer"):
        wrapped = checkpointed(stage, mode)
        assert list(wrapped.state_dict()) == list(stage.state_dict()) == [
            "2.weight", "2.bias", "4.weight", "4.bias"]

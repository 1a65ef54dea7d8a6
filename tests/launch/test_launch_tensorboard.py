"""``distgrad launch`` writes its metrics as TensorBoard event files in the run directory
(with the tensorboard package), read back with TensorBoard's own reader: the same losses,
accuracies and hook values as metrics.jsonl, and a step time per step."""
import pytest

pytest.importorskip("tensorboard")
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator  # noqa: E402

pytestmark = pytest.mark.timeout(120)


def scalars(run_dir):
    acc = EventAccumulator(str(run_dir), size_guidance={"scalars": 0})
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def test_a_launch_logs_its_metrics_for_tensorboard(launcher, tiny_config, tmp_path):
    config = tmp_path / "hooked.toml"
    config.write_text(tiny_config.read_text()
                      + '[[hooks]]\nref = "distgrad.launch.hooks:grad_norm"\n')
    launch = launcher(config, "run.eval_every=3", "model.loss=cross_entropy")
    assert launch.wait() == 0, launch.output
    got = scalars(launch.run_dir)
    steps = [r for r in launch.metrics() if "loss" in r]
    assert got["loss"] == [(r["step"], pytest.approx(r["loss"], rel=1e-6)) for r in steps]
    assert [s for s, _ in got["accuracy"]] == [1, 2, 3, 4, 5, 6]
    for k in range(2):
        assert [s for s, v in got[f"grad_norm.stage{k}"] if v > 0] == [1, 2, 3, 4, 5, 6]
    assert [s for s, _ in got["eval_loss"]] == [3, 6]
    assert [s for s, _ in got["step_time"]] == [1, 2, 3, 4, 5, 6]
    assert all(v > 0 for _, v in got["step_time"])
    assert sum(v for _, v in got["step_time"]) == pytest.approx(steps[-1]["elapsed"], rel=1e-5)

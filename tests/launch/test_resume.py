"""``distgrad launch --resume``: the run it continues is this config's training, a
finished run is reported complete, and nothing a finished run wrote is lost."""
import json
import os
from pathlib import Path

import pytest

pytest.importorskip("zmq")
pytest.importorskip("msgpack")

from distgrad.launch.config import load_config  # noqa: E402
from distgrad.launch.resolve import plan  # noqa: E402
from distgrad.launch.resume import ResumeError, place  # noqa: E402

from launch_support import TINY, reference  # noqa: E402

pytestmark = pytest.mark.timeout(120)


def _files(run_dir):
    return {p.name: p.stat().st_mtime_ns for p in run_dir.iterdir()}


def test_resume_continues_only_its_own_training_and_never_loses_a_result(launcher,
                                                                         tiny_config):
    first = launcher(tiny_config, "run.steps=4", "checkpoint.every=2")
    assert first.wait() == 0, first.output
    run_dir, before = first.run_dir, _files(first.run_dir)
    shown = os.path.relpath(run_dir, first.cwd)
    # other overrides: not this run's training; said so, and nothing starts
    refused = launcher(tiny_config, "world.workers=3", "run.steps=4", "--resume")
    assert refused.wait() == 2, refused.output
    assert "no run of 'tiny' in runs continues this config's training" in refused.output
    assert f"{shown} (overrides: run.steps=4 checkpoint.every=2): trained with " \
           f"world.workers 2 (here 3)" in refused.output
    assert "Traceback" not in refused.output and "coordinator" not in refused.output
    # the same: complete, and nothing starts
    again = launcher(tiny_config, "run.steps=4", "checkpoint.every=2", "--resume")
    assert again.wait() == 0, again.output
    assert f"{shown} is complete: it finished at step 4" in again.output
    assert "coordinator" not in again.output
    assert _files(run_dir) == before and len(list(run_dir.parent.iterdir())) == 1
    # more steps: it goes on, shows only the new progress and keeps the earlier result
    longer = launcher(tiny_config, "run.steps=8", "checkpoint.every=2", "--resume",
                      progress=True)
    assert longer.wait() == 0, longer.output
    assert longer.run_dir == run_dir
    progress = [line.split()[3] for line in longer.output.splitlines()
                if line.startswith("launch | progress ")]
    assert progress == ["5/8", "6/8", "7/8", "8/8"], longer.output  # none of steps 1..4
    assert longer.losses() == reference(tiny_config, steps=8)        # the same training
    earlier = json.loads((run_dir / "result-step4.json").read_text())
    assert earlier["status"] == "finished" and earlier["step"] == 4
    assert json.loads((run_dir / "result.json").read_text())["step"] == 8


def _fake_run(parent, name, config, *, step=None, stages=2, balance=(2, 3), finished=None,
              overrides=()):
    """A run directory as a launch leaves it (without training)."""
    from distgrad.launch import checkpoint as ckpt
    from distgrad.launch.rundir import write_json
    path = parent / name  # relative, as run.dir is
    path.mkdir(parents=True)
    write_json(str(path / "launch.json"), {"config": config, "overrides": list(overrides)})
    if step is not None:
        directory = ckpt.step_dir(str(path), step)
        os.makedirs(directory)
        ckpt.write_manifest(directory, {"step": step, "stages": stages, "replicas": 1,
                                        "balance": list(balance), "config": "tiny"})
    if finished is not None:
        write_json(str(path / "result.json"), {"status": "finished", "step": finished})
    return str(path)


def test_the_newest_fitting_run_is_picked_and_newer_misfits_are_named(tmp_path, tiny_config,
                                                                      monkeypatch):
    monkeypatch.chdir(tmp_path)
    config = load_config(tiny_config)
    resolved = plan(config)
    runs = Path("runs")
    wider = load_config(tiny_config, ["model.kwargs={sizes = [2, 16, 16, 2]}"])
    fits = _fake_run(runs, "tiny-1", config, step=2)
    os.utime(os.path.join(fits, "checkpoints", "step-00000002", "manifest.ckpt"), (1, 1))
    _fake_run(runs, "tiny-2", wider, step=4, overrides=["model.kwargs={sizes = [2, 16, 16, 2]}"])
    _fake_run(runs, "tiny-3", config, step=4, stages=3, balance=(1, 2, 2))
    extra = load_config(tiny_config, ["run.name=tiny-extra"])   # another config's runs
    _fake_run(runs, "tiny-extra-1", extra, step=6)
    notes = []
    where = place(config, resolved, resume=True, note=notes.append)
    assert where.run_dir == fits and where.resume_from.endswith("step-00000002")
    assert where.complete is None
    assert any("passes over runs/tiny-2 (overrides: model.kwargs={sizes = [2, 16, 16, 2]}): "
               "trained with model.kwargs.sizes [2, 16, 16, 2] (here [2, 8, 8, 2])" in n
               for n in notes), notes
    assert any("runs/tiny-3: its checkpoint at step 4 holds 3 stage(s)" in n for n in notes)
    # a run named with --run-dir that does not fit is an error, not a guess
    with pytest.raises(ResumeError, match=r"runs/tiny-2 .*cannot be continued with this "
                                          r"config: trained with model.kwargs.sizes"):
        place(config, resolved, resume=True, run_dir=str(runs / "tiny-2"))
    # an optimizer argument is restored from the checkpoint: changing it is refused too
    faster = load_config(tiny_config, ["optim.lr=0.5"])
    with pytest.raises(ResumeError, match=r"trained with optim.lr 0.05 \(here 0.5\)"):
        place(faster, plan(faster), resume=True, run_dir=fits)
    # nothing of this name: a new run, said so
    other = load_config(tiny_config, ["run.name=fresh"])
    where = place(other, plan(other), resume=True, note=notes.append)
    assert os.path.basename(where.run_dir).startswith("fresh-") and where.resume_from is None
    assert "nothing to resume" in notes[-1]


def test_a_finished_run_without_checkpoint_is_complete_or_not_continued(tmp_path, tiny_config,
                                                                       monkeypatch):
    monkeypatch.chdir(tmp_path)
    config = load_config(tiny_config)      # 6 steps
    done = _fake_run(Path("runs"), "tiny-1", config, finished=6)
    assert place(config, plan(config), resume=True).complete == 6
    longer = load_config(tiny_config, ["run.steps=9"])
    notes = []
    where = place(longer, plan(longer), resume=True, note=notes.append)
    assert where.run_dir != done and where.resume_from is None
    assert "finished at step 6 and has no checkpoint to go on from" in notes[-1]
    with pytest.raises(ResumeError, match="no checkpoint to go on from"):
        place(longer, plan(longer), resume=True, run_dir=done)


def test_a_run_given_in_epochs_is_complete_after_its_epochs(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    path = tmp_path / "tiny.toml"
    path.write_text(TINY.replace("steps = 6", "epochs = 2"))
    config = load_config(path)
    runs = Path("runs")
    steps = 2 * 6  # 256 samples, 20% held out, batches of 32: 6 per epoch
    _fake_run(runs, "tiny-1", config, finished=steps - 1, step=steps - 1)
    assert place(config, plan(config), resume=True).complete is None
    _fake_run(runs, "tiny-2", config, finished=steps)
    assert place(config, plan(config), resume=True).complete == steps

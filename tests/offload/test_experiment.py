"""``distgrad offload CONFIG``: the offloading experiment as a command of the installed
package: its config checks, its help, and a tiny experiment run end to end."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from distgrad.offload.experiment.config import ExperimentConfigError, describe, load_config

pytestmark = pytest.mark.timeout(120)

ROOT = Path(__file__).resolve().parents[2]
BASE = '[model]\nbatch = 8\nwidth = 8\nlayers = 1\n[[run]]\nname = "none"\nkind = "none"\n'


def _distgrad(*args, cwd):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p))
    return subprocess.run([sys.executable, "-m", "distgrad", *map(str, args)], cwd=cwd,
                          env=env, capture_output=True, text=True, timeout=100)


def test_config_errors_name_the_file_and_the_key(tmp_path):
    cfg = tmp_path / "exp.toml"
    cfg.write_text(BASE)
    config = load_config(cfg)
    assert config["run"][0]["name"] == "none" and config["experiment"]["steps"] == 3
    assert config["store"] == {"memory_bytes": "4G", "bind": "ipc"}
    for extra, message in (
            ('[experiment]\nstepz = 3\n', r"experiment.stepz: unknown key; \[experiment\] takes"),
            ('[experiment]\nsteps = 0\n', "experiment.steps: must be at least 1"),
            ('[experiment]\nbaseline = "disk"\n', "'disk' is not the name of a \\[\\[run\\]\\]"),
            ('[store]\nmemory_bytes = "lots"\n', "store.memory_bytes: expected a byte count"),
            ('[[run]]\nname = "d"\nkind = "disk"\nreed = "mmap"\n',
             r"\[\[run\]\] 'd': unknown key 'reed'"),
            ('[[run]]\nname = "t"\nkind = "tiered"\n', "needs key 'memory_bytes'"),
            ('[[run]]\nname = "none"\nkind = "disk"\n', "name is used twice"),
            ('[modle]\n', "modle: unknown table or key"),
            ('[world]\nworkers = 2\n', r"not an offloading experiment's config: run it with "
                                       r"`distgrad launch .*exp.toml`"),
            ('[[run]]\nname = "c"\nkind = "none"\ncheckpoint = "some"\n',
             r"\[\[run\]\] 'c': key 'checkpoint' must be one of 'none', 'full', 'selective'"),
            ('[[run]]\nname = "c"\nkind = "none"\nsegments = 2\n',
             "key 'segments' needs checkpoint"),
            ('[[run]]\nname = "t"\nkind = "disk"\nframework = "torch"\n',
             "framework \"torch\" runs PyTorch without offloading"),
            ('[sweep]\nrun = "none"\nmin_bytes = ["1M"]\n',
             "sweep.run: 'none' is not the name of a \\[\\[run\\]\\] that offloads"),
            ('[[run]]\nname = "d"\nkind = "disk"\n[sweep]\nrun = "d"\nmin_bytes = ["lots"]\n',
             "sweep.min_bytes: expected byte counts"),
            ('[experiment]\ntarget_memory = 1.5\n', "experiment.target_memory must be in")):
        cfg.write_text(BASE + extra)
        with pytest.raises(ExperimentConfigError, match=message) as info:
            load_config(cfg)
        assert str(info.value).startswith(f"{cfg}: ")
    with pytest.raises(ExperimentConfigError, match="model.batch: missing"):
        cfg.write_text(BASE.replace("batch = 8\n", ""))
        load_config(cfg)


def test_every_shipped_experiment_config_loads():
    for path in (ROOT / "configs").glob("offload_*.toml"):
        assert load_config(path)["run"]


def test_help_config_lists_every_key(tmp_path):
    from distgrad.offload.config import KEY_DOCS, POLICY_DOCS
    from distgrad.offload.experiment.config import RUN_KEYS, SCHEMA, SWEEP_KEYS
    done = _distgrad("offload", "--help-config", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == describe()
    keys = {line.split()[0] for line in describe() if line.startswith("  ")}
    assert keys >= {k for fields in SCHEMA.values() for k in fields} | set(KEY_DOCS) \
        | set(POLICY_DOCS) | set(RUN_KEYS) | set(SWEEP_KEYS)
    helped = _distgrad("offload", "--help", cwd=tmp_path)
    assert helped.returncode == 0 and "--help-config" in helped.stdout
    assert "distgrad offload configs/offload_mlp.toml" in helped.stdout   # examples


def test_the_commands_name_each_other_for_the_wrong_config(tmp_path):
    launched = _distgrad("launch", ROOT / "configs" / "offload_mlp.toml", cwd=tmp_path)
    assert launched.returncode == 2
    assert "experiment: not a launch config: run it with `distgrad offload " in launched.stderr
    measured = _distgrad("offload", ROOT / "configs" / "quickstart.toml", cwd=tmp_path)
    assert measured.returncode == 2
    assert "not an offloading experiment's config: run it with `distgrad launch " \
        in measured.stderr
    assert not (tmp_path / "runs").exists()


TINY = BASE.replace("width = 8", "width = 16").replace("layers = 1", "layers = 4") + """\
[experiment]
name = "tiny"
steps = 2
[store]
memory_bytes = "16M"
[[run]]
name = "disk"
kind = "disk"
[run.policy]
min_bytes = 0
[[run]]
name = "store"
kind = "remote"
[run.policy]
min_bytes = 0
[[run]]
name = "checkpoint+disk"
kind = "disk"
checkpoint = "full"
segments = 2
[run.policy]
min_bytes = 0
[sweep]
run = "disk"
prefetch_bytes = [0]
"""


def test_a_tiny_experiment_measures_every_run(tmp_path):
    (tmp_path / "tiny.toml").write_text(TINY)
    done = _distgrad("offload", "tiny.toml", "--no-progress", "--no-plot", cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    table = done.stdout[done.stdout.index("run "):].splitlines()
    names = ["none", "disk", "store", "checkpoint+disk", "disk"]
    assert [line.split()[0] for line in table[2:7]] == names
    assert "- target (at most 15% of 'none''s activation memory" in done.stdout
    results = json.loads((tmp_path / "runs" / "tiny" / "results.json").read_text())
    rows = {r["run"]: r for r in results["rows"]}
    assert rows["none"]["bytes_offloaded"] == 0 and rows["none"]["bytes_moved"] == 0
    assert rows["disk"]["bytes_offloaded"] > 0 and rows["store"]["bytes_offloaded"] > 0
    # with checkpointing only the segments' inputs are saved: the second one leaves
    assert 0 < rows["checkpoint+disk"]["bytes_offloaded"] < rows["disk"]["bytes_offloaded"]
    assert rows["disk"]["bytes_moved"] > rows["disk"]["bytes_offloaded"]  # out and back
    assert rows["disk prefetch_bytes=0"]["sweep"] == {"run": "disk", "key": "prefetch_bytes",
                                                      "bytes": 0}
    assert all(r["forward_bytes"] is not None and r["front"] is not None for r in rows.values())
    assert results["verdict"] and all(len(results["results"][name]["steps_s"]) == 2
                                      for name in rows)


@pytest.mark.parametrize("run", [{"checkpoint": "full", "segments": 2},
                                 {"checkpoint": "selective"}, {"checkpoint": "full"}])
def test_a_runs_checkpointed_forward_gives_the_plain_gradients(run):
    from distgrad.offload.experiment.methods import build
    model_config = {"batch": 4, "width": 8, "layers": 5, "activation": "gelu", "seed": 0}
    grads = []
    for r in ({}, run):
        model, x, forward = build(model_config, r)
        assert (forward is None) == (r == {})
        (forward or model)(x).pow(2).mean().backward()
        grads.append([p.grad.numpy() for p in model.parameters()])
    assert all((a == b).all() for a, b in zip(*grads))

"""SummaryWriter's event files read back with TensorBoard's own reader (EventAccumulator),
next to torch.utils.tensorboard's for the same calls where PyTorch is installed."""
import os
import subprocess
import sys
import time

import numpy as np
import pytest

pytest.importorskip("tensorboard")
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator  # noqa: E402

import distgrad  # noqa: E402
from distgrad.utils.tensorboard import SummaryWriter  # noqa: E402

pytestmark = pytest.mark.timeout(60)


def read(path):
    acc = EventAccumulator(str(path), size_guidance={"tensors": 0, "scalars": 0})
    acc.Reload()
    return acc


def log_everything(writer_cls, path, values):
    with writer_cls(str(path)) as w:
        for step in range(4):
            w.add_scalar("train/loss", 1.0 / (step + 1), step)
        w.add_scalars("curves", {"a": 1.5, "b": 2.5}, 3)
        w.add_histogram("weights", values, 1)
        w.add_text("notes", "a **run**", 2)
        w.add_hparams({"lr": 0.1, "opt": "adam", "deep": True}, {"hparam/acc": 0.9},
                      run_name="trial")


def summary(path):
    acc = read(path)
    hist = acc.Histograms("weights")[0].histogram_value
    return {"tags": {k: sorted(v) for k, v in acc.Tags().items() if isinstance(v, list)},
            "loss": [(e.step, e.value) for e in acc.Scalars("train/loss")],
            "text": acc.Tensors("notes/text_summary")[0].tensor_proto.string_val,
            "hist": (hist.min, hist.max, hist.num, round(hist.sum, 6), list(hist.bucket),
                     [round(x, 9) for x in hist.bucket_limit]),
            "runs": sorted(os.listdir(path)[i] for i in range(len(os.listdir(path)))
                           if os.path.isdir(os.path.join(path, os.listdir(path)[i]))),
            "a": [(e.step, e.value) for e in read(path / "curves_a").Scalars("curves")],
            "trial": sorted(read(path / "trial").Tags()["scalars"])}


def test_what_it_logs_reads_back(tmp_path):
    values = np.random.default_rng(0).standard_normal(500)
    log_everything(SummaryWriter, tmp_path, distgrad.tensor(values))
    got = summary(tmp_path)
    assert got["loss"] == [(0, 1.0), (1, 0.5), (2, pytest.approx(1 / 3)), (3, 0.25)]
    assert got["text"] == [b"a **run**"]
    assert got["hist"][2] == 500 and sum(got["hist"][4]) == 500
    assert got["runs"] == ["curves_a", "curves_b", "trial"]
    assert got["a"] == [(3, 1.5)] and got["trial"] == ["hparam/acc"]


def test_the_same_calls_as_torch_write_the_same_events(tmp_path):
    pytest.importorskip("torch")
    from torch.utils.tensorboard import SummaryWriter as TorchWriter
    values = np.random.default_rng(0).standard_normal(500)
    log_everything(SummaryWriter, tmp_path / "ours", values)
    log_everything(TorchWriter, tmp_path / "theirs", values)
    assert summary(tmp_path / "ours") == summary(tmp_path / "theirs")
    ours = read(tmp_path / "ours" / "trial").summary_metadata
    theirs = read(tmp_path / "theirs" / "trial").summary_metadata
    assert {k: v.plugin_data.content for k, v in ours.items()} == \
        {k: v.plugin_data.content for k, v in theirs.items()}


def test_log_dir_defaults_to_runs_date_host_comment(tmp_path, monkeypatch):
    import socket
    monkeypatch.chdir(tmp_path)
    with SummaryWriter(comment="-lr0.1") as w:
        w.add_scalar("x", 1.0, 0)
    (run,) = os.listdir(tmp_path / "runs")
    assert run.endswith(f"_{socket.gethostname()}-lr0.1")
    assert time.strptime(run.split("_")[0] + "_" + run.split("_")[1], "%b%d_%H-%M-%S")
    assert w.get_logdir() == os.path.join("runs", run)


def test_purge_step_hides_what_a_resumed_run_redoes(tmp_path):
    with SummaryWriter(tmp_path) as w:
        for step in range(5):
            w.add_scalar("loss", float(step), step)
    time.sleep(1.1)  # a new event file: its name carries the second it was made in
    with SummaryWriter(tmp_path, purge_step=2) as w:
        for step in range(2, 4):
            w.add_scalar("loss", 10.0 + step, step)
    assert [(e.step, e.value) for e in read(tmp_path).Scalars("loss")] == \
        [(0, 0.0), (1, 1.0), (2, 12.0), (3, 13.0)]


def test_a_closed_writer_opens_again(tmp_path):
    w = SummaryWriter(tmp_path)
    w.add_scalar("x", 1.0, 0)
    w.close()
    w.add_scalar("x", 2.0, 1)
    w.close()
    assert [e.value for e in read(tmp_path).Scalars("x")] == [1.0, 2.0]


def test_add_graph_draws_ops_and_parameters(tmp_path):
    net = distgrad.nn.Sequential(distgrad.nn.Linear(3, 4), distgrad.nn.ReLU(),
                                 distgrad.nn.Linear(4, 2))
    with SummaryWriter(tmp_path) as w:
        w.add_graph(net, distgrad.ones(2, 3))
    graph = read(tmp_path).Graph()
    names = {n.name: n for n in graph.node}
    assert {"Sequential/0/weight", "Sequential/2/bias"} <= set(names)
    relu = next(n for n in graph.node if n.op == "Relu")
    assert relu.name.startswith("Sequential/1/")
    linear2 = next(n for n in graph.node if n.op == "Linear" and n.name.startswith("Sequential/2/"))
    assert relu.name in linear2.input and "Sequential/2/weight" in linear2.input


def test_add_graph_of_a_forward_pass_without_autograd_is_a_clear_error(tmp_path):
    net = distgrad.nn.Linear(3, 2).requires_grad_(False)
    with SummaryWriter(tmp_path) as w:
        with pytest.raises(RuntimeError, match="add_graph: distgrad draws"):
            w.add_graph(net, distgrad.ones(1, 3))


def test_without_tensorboard_the_import_says_what_to_install(tmp_path):
    shim = tmp_path / "shim"
    shim.mkdir()
    (shim / "tensorboard.py").write_text('raise ImportError("hidden by the test")\n')
    proc = subprocess.run([sys.executable, "-c", "import distgrad.utils.tensorboard"],
                          env=dict(os.environ, PYTHONPATH=str(shim)), capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode != 0
    assert "ModuleNotFoundError" in proc.stderr and "pip install 'distgrad[tensorboard]'" in \
        proc.stderr
    ok = subprocess.run([sys.executable, "-c", "import distgrad, sys; "
                         "assert 'tensorboard' not in sys.modules"],
                        env=dict(os.environ, PYTHONPATH=str(shim)), timeout=60)
    assert ok.returncode == 0

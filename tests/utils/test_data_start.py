"""How DataLoader workers start: forked, as PyTorch's on Linux (so an unguarded script works),
but never from a process with other threads or a ZeroMQ context; and the index pipe never
deadlocks with a worker that is writing a batch."""
import os
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

import distgrad
from distgrad.utils.start_method import default_context, fork_hazards
from distgrad.utils.data import DataLoader, TensorDataset

pytestmark = pytest.mark.timeout(180)

ROOT = Path(__file__).resolve().parents[2]

# No `if __name__ == "__main__":` guard, two loaders, two epochs: what PyTorch runs on Linux.
_UNGUARDED = textwrap.dedent("""
    import json, os, threading
    import numpy as np
    import torch
    from torch.utils.data import DataLoader, Dataset

    class Squares(Dataset):
        def __len__(self):
            return 10
        def __getitem__(self, i):
            return torch.tensor([float(i * i)]), i

    train = DataLoader(Squares(), batch_size=4, num_workers=2)
    test = DataLoader(Squares(), batch_size=5, num_workers=2)
    seen = []
    for epoch in range(2):
        for x, y in train:
            seen.append(x.sum().item())
        for x, y in test:
            seen.append(y.tolist())
    print("RESULT " + json.dumps(seen))
""")


def _run(argv, tmp_path):
    env = dict(os.environ, PYTHONPATH=str(ROOT), PYTHONWARNINGS="ignore")
    env.pop("DISTGRAD_AS_TORCH", None)
    done = subprocess.run(argv, env=env, cwd=tmp_path, capture_output=True, text=True,
                          timeout=150)
    assert done.returncode == 0, done.stderr[-3000:]
    return [line for line in done.stdout.splitlines() if line.startswith("RESULT")]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="fork is Linux's default")
def test_an_unguarded_script_with_workers_runs_as_on_pytorch(tmp_path):
    script = tmp_path / "unguarded.py"
    script.write_text(_UNGUARDED)
    ours = _run([sys.executable, "-m", "distgrad.compat.as_torch", str(script)], tmp_path)
    assert ours == ["RESULT [14.0, 126.0, 145.0, [0, 1, 2, 3, 4], [5, 6, 7, 8, 9], "
                    "14.0, 126.0, 145.0, [0, 1, 2, 3, 4], [5, 6, 7, 8, 9]]"]
    if __import__("importlib").util.find_spec("torch"):
        assert _run([sys.executable, str(script)], tmp_path) == ours


def test_threads_or_a_zeromq_context_make_workers_spawn_with_a_hint():
    release = threading.Event()
    helper = threading.Thread(target=release.wait, name="busy-helper", daemon=True)
    helper.start()
    try:
        hazards = fork_hazards()
        assert any("busy-helper" in h for h in hazards)
        if os.path.exists("/proc/self/task"):
            assert default_context().get_start_method() in ("spawn", "forkserver")
    finally:
        release.set()
        helper.join(10)
    import zmq
    ctx = zmq.Context()
    try:
        ctx.socket(zmq.PAIR).close()  # the I/O threads start with the first socket ...
        if os.path.exists("/proc/self/task"):
            deadline = time.monotonic() + 10  # ... and name themselves a moment later
            while not any("ZeroMQ" in h for h in fork_hazards()):
                assert time.monotonic() < deadline, fork_hazards()
                time.sleep(0.01)
    finally:
        ctx.term()


def test_a_chosen_start_method_is_used_and_fork_only_when_safe(monkeypatch):
    import multiprocessing
    from distgrad.utils import start_method
    for method in ("spawn", "forkserver", "fork"):
        monkeypatch.setattr(multiprocessing, "get_start_method",
                            lambda allow_none=False, m=method: m)
        monkeypatch.setattr(start_method, "fork_hazards", lambda: [])
        assert default_context().get_start_method() == method
        monkeypatch.setattr(start_method, "fork_hazards", lambda: ["a thread"])
        assert default_context().get_start_method() == ("spawn" if method == "fork" else method)


def test_index_messages_larger_than_the_pipe_wait_instead_of_deadlocking():
    """Each task holds 60000 indices (more than a pipe holds): a second task for a worker
    busy writing its batch would block the parent forever; it waits for room instead."""
    n = 240000
    ds = TensorDataset(distgrad.arange(n, dtype=distgrad.float64))
    loader = DataLoader(ds, batch_size=60000, num_workers=2, prefetch_factor=2,
                        multiprocessing_context="spawn")
    sums = [float(b[0].sum()) for b in loader]
    expected = [float(sum(range(i, i + 60000))) for i in range(0, n, 60000)]
    assert sums == expected

"""Nothing offloaded outlives its use: after backward, after an error in backward, after
the process is SIGKILLed (the next run sweeps); corrupted records are detected."""
import gc
import os
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

import distgrad
from distgrad.offload import CorruptRecordError, OffloadPolicy, save_on_disk
from distgrad.offload.disk import RUN_DIR_PREFIX, DiskTier
from distgrad.offload.records import read_record, write_record

pytestmark = pytest.mark.timeout(60)

ALL = OffloadPolicy(min_bytes=0)


def _forward(hooks, n=4):
    x = distgrad.randn(16, 16, requires_grad=True)
    with hooks:
        h = x
        for _ in range(n):
            h = (h @ h.t()).tanh()
        return h.sum()


def test_no_file_after_backward(tmp_path):
    hooks = save_on_disk(tmp_path, policy=ALL)
    loss = _forward(hooks)
    hooks.flush()
    assert len(hooks.tier.files()) == hooks.stats.tensors_offloaded > 0
    loss.backward()
    # a record whose tensor died while the read-ahead thread held the lock is freed by the
    # drainer as soon as it lets go (a release never waits): within moments, not at once
    deadline = time.monotonic() + 10
    while hooks.tier.files() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert hooks.tier.files() == []
    run_dir = hooks.tier.where
    hooks.close()
    assert not os.path.exists(run_dir)


def test_no_file_after_an_error_in_backward(tmp_path):
    class Boom(distgrad.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x * 1

        @staticmethod
        def backward(ctx, g):
            raise ValueError("boom in backward")

    hooks = save_on_disk(tmp_path, policy=ALL)
    x = distgrad.randn(16, 16, requires_grad=True)
    with hooks:
        loss = Boom.apply((x @ x.t()).tanh()).tanh().sum()   # tanh's records are read first
    hooks.flush()
    assert hooks.tier.files()
    with pytest.raises(ValueError, match="boom in backward"):
        loss.backward()
    del loss
    gc.collect()
    # a record whose tensor died while the read-ahead thread held the lock is freed by a
    # drainer thread as soon as the lock is free: promptly, not necessarily before this line
    deadline = time.monotonic() + 5
    while hooks.tier.files() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert hooks.tier.files() == [] and hooks.live_records() == 0
    hooks.close()


def test_a_killed_run_is_swept_by_the_next(tmp_path):
    child = textwrap.dedent(f"""
        import os, signal, sys
        import distgrad
        from distgrad.offload import save_on_disk
        hooks = save_on_disk({str(tmp_path)!r}, min_bytes=0)
        x = distgrad.randn(64, 64, requires_grad=True)
        with hooks:
            y = (x @ x).tanh().sum()
        hooks.flush()
        print(hooks.tier.where, flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
    """)
    proc = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    left = proc.stdout.strip()
    assert os.path.basename(left).startswith(RUN_DIR_PREFIX) and os.listdir(left)
    tier = DiskTier(tmp_path)            # the next run in the same place
    assert not os.path.exists(left)
    assert os.path.exists(tier.where)
    tier.close()
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("damage", ["flip", "truncate", "swap"])
def test_a_corrupted_record_is_an_error_naming_the_file(tmp_path, damage):
    a = np.arange(4096, dtype=np.uint8)
    info = write_record(str(tmp_path / "a.rec"), 1, a)
    other = write_record(str(tmp_path / "b.rec"), 2, a[::-1].copy())
    if damage == "flip":
        with open(info.path, "r+b") as f:
            f.seek(info.offset + 100)
            byte = f.read(1)
            f.seek(info.offset + 100)
            f.write(bytes([byte[0] ^ 1]))
    elif damage == "truncate":
        os.truncate(info.path, info.offset + 10)
    else:
        os.replace(other.path, info.path)  # a valid record, but not this one
    for use_mmap in (False, True):
        with pytest.raises(CorruptRecordError, match=str(info.path)):
            read_record(info, use_mmap=use_mmap)


def test_corruption_surfaces_at_unpack_not_as_a_wrong_gradient(tmp_path):
    hooks = save_on_disk(tmp_path, policy=ALL, prefetch_bytes=0)
    loss = _forward(hooks, n=1)
    hooks.flush()
    (path,) = hooks.tier.files()
    with open(path, "r+b") as f:
        f.seek(-1, os.SEEK_END)
        last = f.read(1)
        f.seek(-1, os.SEEK_END)
        f.write(bytes([last[0] ^ 0x80]))
    with pytest.raises(CorruptRecordError, match="checksum"):
        loss.backward()
    del loss
    gc.collect()
    hooks.close()


def test_closed_hooks_refuse_to_pack(tmp_path):
    hooks = save_on_disk(tmp_path, policy=ALL)
    hooks.close()
    with pytest.raises(RuntimeError, match="closed"):
        with hooks:
            pass

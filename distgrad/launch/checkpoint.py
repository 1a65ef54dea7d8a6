"""Checkpoints of a launch: one file per stage plus a manifest that marks them complete.

    runs/quickstart-.../checkpoints/step-00000200/stage0.ckpt   (each worker its own)
                                                 /stage1.ckpt
                                                 /manifest.ckpt (the coordinator, last)

Every file is written atomically (a temp file, fsync, rename, fsync of the
directory) with :func:`distgrad.save`, so loading never runs code and a crash
mid-write leaves the previous checkpoint as it was. A checkpoint counts only once
its manifest exists, and the manifest is written after every stage has answered
that its file is on disk.
"""
import os
import re
import shutil

import distgrad
from distgrad.utils.atomic_files import atomic_write

__all__ = ["atomic_save", "step_dir", "stage_path", "write_manifest", "read_manifest", "latest",
           "prune", "MANIFEST"]

MANIFEST = "manifest.ckpt"
_STEP_DIR = re.compile(r"^step-(\d+)$")


def atomic_save(obj, path):
    """``distgrad.save(obj, path)``, but readers see the old file or the whole new one."""
    path = os.fspath(path)
    directory = os.path.dirname(path) or "."
    # a stage on another host than the coordinator's writes to a disk of its own, where
    # nobody made the step's directory
    os.makedirs(directory, exist_ok=True)
    with atomic_write(path) as fh:
        distgrad.save(obj, fh)


def step_dir(run_dir, step):
    return os.path.join(run_dir, "checkpoints", f"step-{step:08d}")


def stage_path(directory, stage):
    return os.path.join(directory, f"stage{stage}.ckpt")


def write_manifest(directory, manifest):
    atomic_save(manifest, os.path.join(directory, MANIFEST))


def read_manifest(directory):
    return distgrad.load(os.path.join(directory, MANIFEST))


def _complete(run_dir):
    """[(step, directory)] of complete checkpoints, oldest first."""
    root = os.path.join(run_dir, "checkpoints")
    try:
        names = os.listdir(root)
    except OSError:
        return []
    found = []
    for name in names:
        m = _STEP_DIR.match(name)
        directory = os.path.join(root, name)
        if m and os.path.exists(os.path.join(directory, MANIFEST)):
            found.append((int(m.group(1)), directory))
    return sorted(found)


def latest(run_dir):
    """``(directory, manifest)`` of the last complete checkpoint, or None."""
    complete = _complete(run_dir)
    if not complete:
        return None
    directory = complete[-1][1]
    return directory, read_manifest(directory)


def prune(run_dir, keep):
    """Remove all but the last ``keep`` complete checkpoints and any incomplete older one."""
    complete = _complete(run_dir)
    if not complete:
        return
    kept = {d for _, d in complete[-keep:]}
    oldest_kept = complete[-keep:][0][0]
    root = os.path.join(run_dir, "checkpoints")
    for name in os.listdir(root):
        m = _STEP_DIR.match(name)
        directory = os.path.join(root, name)
        if m and directory not in kept and int(m.group(1)) < oldest_kept:
            shutil.rmtree(directory, ignore_errors=True)

"""Make ``import torch`` (and ``torch.*``) import distgrad, in this process and in every
process it starts: put this directory on ``PYTHONPATH`` and set ``DISTGRAD_TORCH_ALIAS=1``.

Python imports ``sitecustomize`` at start-up, so children started with the ``spawn``
method (which inherit the environment) alias ``torch`` before they unpickle their target
and re-run the program's main module. A program written for PyTorch then runs on
distgrad unchanged, subprocesses included. Test-only: nothing in the package relies on it.
"""
import importlib
import importlib.abc
import importlib.util
import os
import sys


class _Alias(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """``torch`` -> ``distgrad``, ``torch.x.y`` -> ``distgrad.x.y`` (same module objects)."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname != "torch" and not fullname.startswith("torch."):
            return None
        return importlib.util.spec_from_loader(fullname, self)

    def create_module(self, spec):
        return importlib.import_module("distgrad" + spec.name[len("torch"):])

    def exec_module(self, module):
        pass  # already executed under its own name


if os.environ.get("DISTGRAD_TORCH_ALIAS") == "1" and not any(
        isinstance(f, _Alias) for f in sys.meta_path):
    sys.meta_path.insert(0, _Alias())

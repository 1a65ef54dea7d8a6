"""Installed by ``distgrad.compat.as_torch`` in the ``PYTHONPATH`` of a program and its
children: when ``DISTGRAD_AS_TORCH=1``, ``import torch`` imports distgrad.

Python imports the first ``sitecustomize`` on its path at start-up; this one then
loads the one it shadows (a distribution's or a virtual environment's), if any.
"""
import importlib.machinery
import importlib.util
import os
import sys


def _alias_torch():
    if os.environ.get("DISTGRAD_AS_TORCH") == "1":
        from distgrad.compat import as_torch
        as_torch.install()


def _load_shadowed():
    here = os.path.dirname(os.path.abspath(__file__))
    rest = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is not None and spec.loader is not None:
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)


_alias_torch()
_load_shadowed()

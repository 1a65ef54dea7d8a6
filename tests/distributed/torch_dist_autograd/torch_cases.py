"""PyTorch's distributed autograd tests, loaded from the installed torch as they run.

``dist_autograd_cases`` is no file of ours: importing it reads
``torch/testing/_internal/distributed/rpc/dist_autograd_test.py`` from the installed
PyTorch package and runs it with one change, made as it is loaded: its imports of
``torch.testing._internal`` (PyTorch's test internals, which need PyTorch itself) name
``pytorch_fixture`` instead, which rebuilds what the tests use on public API. Every other
line, and every line number, is PyTorch's; a traceback points into PyTorch's file. So the
same bodies run on PyTorch and, under ``python -m distgrad.compat.as_torch`` (where
``import torch`` is distgrad), on distgrad.

The file is found on ``sys.path`` without importing ``torch``: under the import swap,
``torch`` is distgrad, and PyTorch's package is only read.
"""
import ast
import importlib.abc
import importlib.machinery
import importlib.util
import sys
from pathlib import Path

__all__ = ["MODULE", "FIXTURE", "torch_test_file", "source", "install"]

MODULE = "dist_autograd_cases"
FIXTURE = "pytorch_fixture"
_INTERNALS = "torch.testing._internal"
_RELATIVE = "testing/_internal/distributed/rpc/dist_autograd_test.py"


def torch_test_file():
    """The installed PyTorch's dist_autograd test file, or None (no PyTorch, or a build
    without its test internals)."""
    spec = importlib.machinery.PathFinder.find_spec("torch")  # sys.path only: no alias
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(next(iter(spec.submodule_search_locations))) / _RELATIVE
    return path if path.exists() else None


def source(text):
    """``text`` with each import of PyTorch's test internals naming the fixture instead,
    one line for one line (the statements' other text is kept)."""
    lines = text.splitlines(keepends=True)
    for node in ast.parse(text).body:
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith(_INTERNALS):
            first = lines[node.lineno - 1]
            lines[node.lineno - 1] = first.replace(node.module, FIXTURE, 1)
        elif isinstance(node, ast.Import) and any(a.name.startswith(_INTERNALS)
                                                  for a in node.names):
            lines[node.lineno - 1] = f"import {FIXTURE}\n"
    return "".join(lines)


class _Loader(importlib.abc.Loader):
    def __init__(self, path):
        self.path = path

    def create_module(self, spec):
        return None

    def exec_module(self, module):
        code = compile(source(self.path.read_text()), str(self.path), "exec")
        exec(code, module.__dict__)  # noqa: S102 - the installed PyTorch's own test file


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name != MODULE:
            return None
        found = torch_test_file()
        if found is None:
            raise ImportError(f"{MODULE}: no PyTorch with its test internals on sys.path "
                              f"(looked for torch/{_RELATIVE})")
        return importlib.util.spec_from_file_location(MODULE, found, loader=_Loader(found))


def install():
    """Make ``import dist_autograd_cases`` (and ``importlib.reload``) load PyTorch's file."""
    if not any(isinstance(f, _Finder) for f in sys.meta_path):
        sys.meta_path.insert(0, _Finder())

"""Run a PyTorch program on distgrad, unchanged: ``import torch`` imports distgrad.

::

    python -m distgrad.compat.as_torch train.py --epochs 3      # a script and its arguments
    python -m distgrad.compat.as_torch -m mypackage.train       # or a module, as python -m

The program runs as ``python train.py`` would run it (its ``__main__``, its
``sys.argv``), with a finder first on ``sys.meta_path`` that resolves ``torch``
to ``distgrad`` and ``torch.X.Y`` to ``distgrad.X.Y``: ``import torch.nn as nn``,
``from torch.distributed import rpc``, ``torch.multiprocessing.spawn`` all
reach distgrad. A submodule distgrad lacks fails as
``ModuleNotFoundError: No module named 'distgrad.X'``.

Processes the program starts inherit the alias: the runner sets
``DISTGRAD_AS_TORCH=1`` and puts a directory holding a ``sitecustomize``
module (and, when distgrad runs from a source checkout rather than
site-packages, the checkout) first on ``PYTHONPATH``,
so a child started by ``torch.multiprocessing.spawn``, a DataLoader worker or
``subprocess.run([sys.executable, ...])`` installs the finder before it runs
anything else. That ``sitecustomize`` then loads the one it shadows, if the
environment has one.

In a process of your own, :func:`install` does the same for later imports
(``torch`` must not have been imported yet)::

    from distgrad.compat import as_torch
    as_torch.install()
    import torch          # distgrad
"""
import importlib
import importlib.abc
import importlib.util
import os
import sys

__all__ = ["install", "uninstall", "installed", "child_environment", "ENV_FLAG", "main"]

#: Set to ``"1"`` in the environment of processes that alias ``torch`` to distgrad.
ENV_FLAG = "DISTGRAD_AS_TORCH"

#: The directory holding this feature's ``sitecustomize.py``.
SITE_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "site")

_ALIAS, _TARGET = "torch", "distgrad"


class _AliasLoader(importlib.abc.Loader):
    """Puts the distgrad module itself in ``sys.modules`` under the torch name (no copy:
    ``torch.nn is distgrad.nn``)."""

    def __init__(self, target):
        self.target = target

    def create_module(self, spec):
        return None  # a placeholder; exec_module replaces it in sys.modules

    def exec_module(self, module):
        # The import system returns whatever sys.modules holds under the name once
        # exec_module is done, so the placeholder never reaches the program.
        sys.modules[module.__name__] = importlib.import_module(self.target)


class _AliasFinder(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name != _ALIAS and not name.startswith(_ALIAS + "."):
            return None
        return importlib.util.spec_from_loader(name, _AliasLoader(_TARGET + name[len(_ALIAS):]))


_finder = _AliasFinder()


def installed():
    """Whether ``import torch`` imports distgrad in this process."""
    return _finder in sys.meta_path


def install():
    """Alias ``torch`` to distgrad for the imports that follow in this process.

    Raises ``RuntimeError`` if the real ``torch`` is already imported (its modules
    would mix with distgrad's).
    """
    loaded = sys.modules.get(_ALIAS)
    if loaded is not None and not getattr(loaded, "__name__", "").startswith(_TARGET):
        raise RuntimeError("distgrad.compat.as_torch.install(): the real torch is already "
                           "imported in this process; install the alias before any "
                           "`import torch`")
    if not installed():
        sys.meta_path.insert(0, _finder)


def uninstall():
    """Undo :func:`install`; ``torch`` names already imported are removed from sys.modules."""
    if installed():
        sys.meta_path.remove(_finder)
    for name in [n for n in sys.modules if n == _ALIAS or n.startswith(_ALIAS + ".")]:
        if getattr(sys.modules[name], "__name__", "").startswith(_TARGET):
            del sys.modules[name]


def child_environment(env=None):
    """A copy of ``env`` (default ``os.environ``) in which Python processes alias torch
    to this distgrad: the flag set, :data:`SITE_DIR` (and a source checkout of
    distgrad) first on ``PYTHONPATH``."""
    env = dict(os.environ if env is None else env)
    here = os.path.dirname(os.path.dirname(os.path.abspath(
        importlib.import_module(_TARGET).__file__)))
    ours = [SITE_DIR]
    if here not in _site_packages():  # a source checkout: children must import this one too
        ours.append(here)
    paths = ours + [p for p in env.get("PYTHONPATH", "").split(os.pathsep)
                    if p and p not in ours]
    env["PYTHONPATH"] = os.pathsep.join(paths)
    env[ENV_FLAG] = "1"
    return env


def _site_packages():
    """Directories every child finds on its own (putting one of them on PYTHONPATH would
    move it ahead of the standard library)."""
    import site
    dirs = list(getattr(site, "getsitepackages", lambda: [])())
    dirs.append(getattr(site, "getusersitepackages", lambda: "")())
    return {os.path.abspath(d) for d in dirs if d}


_USAGE = "usage: python -m distgrad.compat.as_torch (SCRIPT | -m MODULE) [ARGS ...]"


def main(argv=None):
    """Re-execute Python on the program with the alias installed (see the module doc)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] in (["-h"], ["--help"]):
        print(_USAGE)
        return 0
    if not argv or argv == ["-m"]:
        print(_USAGE, file=sys.stderr)
        return 2
    if argv[0] != "-m" and not os.path.exists(argv[0]):
        print(f"as_torch: can't open file {argv[0]!r}: no such file", file=sys.stderr)
        return 2
    # exec, not runpy: the program is then __main__ exactly as under `python SCRIPT`,
    # which is what multiprocessing's spawn re-imports in each child.
    os.execve(sys.executable, [sys.executable] + argv, child_environment())


if __name__ == "__main__":
    sys.exit(main())

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

from distgrad.autograd.naming import set_public_name

__all__ = ["install", "uninstall", "installed", "child_environment", "ENV_FLAG", "main"]

#: Set to ``"1"`` in the environment of processes that alias ``torch`` to distgrad.
ENV_FLAG = "DISTGRAD_AS_TORCH"

#: The directory holding this feature's ``sitecustomize.py``.
SITE_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "site")

_ALIAS, _TARGET = "torch", "distgrad"

#: torch modules whose stand-ins live elsewhere than ``distgrad.<same path>``.
_REDIRECTS = {"torch.version": "distgrad.compat.torch_version",
              "torch.torch_version": "distgrad.compat.torch_version"}


def _target_of(name):
    return _REDIRECTS.get(name) or _TARGET + name[len(_ALIAS):]


class _AliasLoader(importlib.abc.InspectLoader):
    """Puts the distgrad module itself in ``sys.modules`` under the torch name (no copy:
    ``torch.nn is distgrad.nn``). For ``python -m torch.X`` (runpy), it hands out the
    code of ``distgrad.X``, which then runs as ``__main__``."""

    def __init__(self, target, target_spec):
        self.target = target
        self.target_spec = target_spec

    def create_module(self, spec):
        return None  # a placeholder; exec_module replaces it in sys.modules

    def exec_module(self, module):
        # The import system returns whatever sys.modules holds under the name once
        # exec_module is done, so the placeholder never reaches the program.
        target = importlib.import_module(self.target)
        if module.__name__ == _ALIAS:
            _pose_as_torch(target)
        sys.modules[module.__name__] = target

    def _loader(self):
        if self.target_spec is None or self.target_spec.loader is None:
            raise ModuleNotFoundError(f"No module named {self.target!r}", name=self.target)
        return self.target_spec.loader

    def is_package(self, fullname):
        return self.target_spec is not None and \
            self.target_spec.submodule_search_locations is not None

    def get_code(self, fullname):
        return self._loader().get_code(self.target)

    def get_source(self, fullname):
        return self._loader().get_source(self.target)


def _pose_as_torch(distgrad_module):
    """What ``torch`` has and distgrad, seen as torch, must show: the torch release it
    answers for as ``__version__`` (see :mod:`.torch_version`) and ``torch.version``."""
    from . import torch_version
    distgrad_module.__version__ = torch_version.__version__
    distgrad_module.version = torch_version


class _AliasFinder(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name != _ALIAS and not name.startswith(_ALIAS + "."):
            return None
        to = _target_of(name)
        try:
            found = importlib.util.find_spec(to)
        except ModuleNotFoundError:  # a parent is missing: the import fails naming it
            found = None
        return importlib.util.spec_from_loader(
            name, _AliasLoader(to, found), origin=found.origin if found else None,
            is_package=bool(found and found.submodule_search_locations is not None))


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
    set_public_name(_ALIAS)  # reprs say torch.float32, torch.Size([...]) as PyTorch's


def uninstall():
    """Undo :func:`install`; ``torch`` names already imported are removed from sys.modules."""
    if installed():
        sys.meta_path.remove(_finder)
    set_public_name(_TARGET)
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

"""Subpackages that load on first use, as ``torch.distributed`` does after ``import torch``.

A package hands :func:`submodules_on_first_use` its name and makes the result its module
``__getattr__`` (PEP 562): an attribute that names one of its public submodules imports
it then, and only then, so importing the package stays cheap. The package names none of
them: what is importable below it is what loads.

>>> import distgrad
>>> distgrad.distributions.Normal.__name__
'Normal'
"""
import importlib
import importlib.util

__all__ = ["submodules_on_first_use"]


def submodules_on_first_use(package):
    """A module ``__getattr__`` for ``package`` (its ``__name__``) that imports the public
    submodule an attribute names, or raises the AttributeError Python would."""
    def __getattr__(name):
        if not name.startswith("_"):
            full = f"{package}.{name}"
            if importlib.util.find_spec(full) is not None:
                return importlib.import_module(full)  # which also sets the attribute
        raise AttributeError(f"module {package!r} has no attribute {name!r}")
    return __getattr__

"""``distgrad.compile`` and ``distgrad.compiler``: no compiler; the model runs as written.

``compile`` returns the model or function it is given, unchanged, and says so
once with a warning, so a program that calls ``torch.compile(model)`` runs
(eagerly) after the import swap.

>>> import warnings, distgrad
>>> f = lambda x: x + 1
>>> with warnings.catch_warnings():
...     warnings.simplefilter("ignore")
...     distgrad.compile(f) is f
True
"""
import warnings

__all__ = ["compile", "disable", "is_compiling"]

_noted = False


def compile(model=None, *, fullgraph=False, dynamic=None, backend="inductor", mode=None,  # noqa: A001
            options=None, name=None, disable=False, recompile_limit=None,
            isolate_recompiles=False, shapes_spec=None):
    """Return ``model`` unchanged (or, without a model, a decorator that does)."""
    if model is None:
        return lambda fn: compile(fn, fullgraph=fullgraph, dynamic=dynamic, backend=backend,
                                  mode=mode, options=options, name=name, disable=disable)
    global _noted
    if not _noted:
        _noted = True
        warnings.warn("distgrad.compile returns the model unchanged: distgrad has no compiler, "
                      "the model runs eagerly", UserWarning, stacklevel=2)
    return model


def disable(fn=None, recursive=True, *, reason=None):
    """Return ``fn`` unchanged (nothing is compiled, so nothing needs disabling)."""
    return (lambda f: f) if fn is None else fn


def is_compiling():
    return False

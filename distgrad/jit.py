"""``torch.jit`` where TorchScript does not exist: scripting is a pass-through.

distgrad runs Python; there is no TorchScript compiler to hand a function or module
to. ``script`` returns what it is given, so code written for TorchScript (a
``@torch.jit.script`` helper, a scripted module) runs as the Python it is, with the
same results. What only TorchScript can do (tracing a graph, saving or loading a
serialized TorchScript program) raises instead of doing something else.

>>> import distgrad
>>> @distgrad.jit.script
... def add(a, b):
...     return a + b
>>> add(distgrad.ones(2), distgrad.ones(2))
tensor([2., 2.])
"""

__all__ = ["script", "ignore", "unused", "export", "is_scripting", "is_tracing", "trace",
           "save", "load", "ScriptModule", "ScriptFunction"]

_NO_TORCHSCRIPT = "distgrad has no TorchScript"


def script(obj, optimize=None, _frames_up=0, _rcb=None, example_inputs=None):
    """``obj`` itself: functions and modules run as Python (TorchScript's results)."""
    return obj


def _directive(fn=None, **kwargs):
    # @torch.jit.ignore and @torch.jit.ignore(drop=True) alike
    return fn if fn is not None else (lambda f: f)


#: TorchScript's compiler directives; without a compiler they leave the function as it is.
ignore = unused = export = _directive


def is_scripting():
    """False: code never runs inside TorchScript here."""
    return False


def is_tracing():
    return False


def trace(func, example_inputs=None, *args, **kwargs):
    raise RuntimeError(f"torch.jit.trace: {_NO_TORCHSCRIPT}, so a traced graph (which freezes "
                       "the control flow taken on the example inputs) cannot be made; call the "
                       "function or module directly")


def save(m, f, _extra_files=None):
    raise RuntimeError(f"torch.jit.save: {_NO_TORCHSCRIPT} programs to save; save the "
                       "module's state_dict with distgrad.save")


def load(f, map_location=None, _extra_files=None):
    raise RuntimeError(f"torch.jit.load: {_NO_TORCHSCRIPT}: a serialized TorchScript program "
                       "cannot be loaded")


class ScriptModule:
    """Never instantiated here (``script`` returns the module itself); present so that
    ``isinstance(m, torch.jit.ScriptModule)`` answers False instead of failing."""

    def __init__(self, *args, **kwargs):
        raise RuntimeError(f"torch.jit.ScriptModule: {_NO_TORCHSCRIPT}")


class ScriptFunction(ScriptModule):
    pass

"""Functions and classes named by reference, ``"module:qualname"``, never pickled.

What travels or is saved is the name; what comes back is the object that name
resolves to under a rule of trust (RPC's allowlist, ``distgrad.load``'s
``allowed_modules``). A script's module is ``__main__`` in the process that runs
it and ``__mp_main__`` in the children multiprocessing spawns from it; a
reference spells both ``__main__``.

>>> import distgrad
>>> reference_of(distgrad.nn.Linear)
'distgrad.nn.modules.linear:Linear'
>>> lookup(reference_of(distgrad.nn.Linear), distgrad.nn.modules.linear) is distgrad.nn.Linear
True
"""
import inspect
import sys
import types

__all__ = ["reference_of", "canonical_module", "split_reference", "lookup", "loaded_module"]

_MAIN_NAMES = ("__main__", "__mp_main__")


def canonical_module(name):
    """``__mp_main__`` (a script's module in a spawned child) is ``__main__`` in a reference."""
    return "__main__" if name in _MAIN_NAMES else name


def reference_of(obj):
    """``module:qualname`` of a module-level function or class (or a class's method);
    ``TypeError`` for anything else (lambdas, local functions, bound methods, objects)."""
    if not (inspect.isfunction(obj) or inspect.isclass(obj) or inspect.isbuiltin(obj)):
        raise TypeError(f"{obj!r} is not a function or class; only those travel by reference")
    mod = getattr(obj, "__module__", None)
    qual = getattr(obj, "__qualname__", None)
    if not isinstance(mod, str) or not isinstance(qual, str) or "<" in qual:
        raise TypeError(f"{obj!r} has no module-level name (lambdas and functions or classes "
                        "defined inside a function have none), so it cannot travel by reference")
    return f"{canonical_module(mod)}:{qual}"


def split_reference(ref):
    """``(module, [qualname parts])`` of a well-formed reference; ``ValueError`` otherwise.

    Private (dunder) names and anything that is not a dotted identifier are refused.
    """
    if not isinstance(ref, str) or ref.count(":") != 1 or len(ref) > 512:
        raise ValueError(f"malformed reference {ref!r} (expected 'module:qualname')")
    module, _, qual = ref.partition(":")
    parts = qual.split(".")
    if not module or not all(m.isidentifier() for m in module.split(".")) \
            or any(not p.isidentifier() or p.startswith("__") for p in parts):
        raise ValueError(f"malformed or private reference {ref!r}")
    return canonical_module(module), parts


def loaded_module(name):
    """The module ``name`` (``__main__`` included) if this process has imported it, else None."""
    module = sys.modules.get(canonical_module(name))
    if module is None or getattr(getattr(module, "__spec__", None), "_initializing", False):
        return None
    return module


def lookup(ref, module):
    """The function or class ``ref`` names inside ``module`` (already imported).

    Attributes are read statically (no module ``__getattr__``, no descriptors run), the
    path may not pass through another module, and the object found must be *defined*
    under that name (its own ``__module__`` and ``__qualname__``), so a module cannot
    serve as a trampoline to something it imported. ``LookupError`` says why not.
    """
    mod_name, parts = split_reference(ref)
    obj = module
    for part in parts:
        try:
            obj = inspect.getattr_static(obj, part)
        except AttributeError:
            raise LookupError(f"{ref!r}: module {mod_name!r} has no attribute "
                              f"{'.'.join(parts)!r}") from None
        if isinstance(obj, (staticmethod, classmethod)):
            obj = obj.__func__
        if isinstance(obj, types.ModuleType):
            raise LookupError(f"{ref!r}: {part!r} is a module, not a function or class")
    if not (inspect.isfunction(obj) or inspect.isclass(obj) or inspect.isbuiltin(obj)):
        raise LookupError(f"{ref!r} names a {type(obj).__qualname__}, not a function or class")
    own = f"{canonical_module(getattr(obj, '__module__', None) or '')}:" \
          f"{getattr(obj, '__qualname__', '')}"
    if own != f"{mod_name}:{'.'.join(parts)}":
        raise LookupError(f"{ref!r} is {own!r} imported into {mod_name!r}, not defined there")
    return obj

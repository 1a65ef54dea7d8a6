"""Callables travel by reference (``module:qualname``) and resolve against an allowlist.

Nothing that arrives over a socket is unpickled or evaluated: a reference names a
module, which must equal an allowed name or be a submodule of one, and a dotted
attribute path inside it. Dunder attributes are refused (no ``__globals__`` walks)
and the object found must itself come from an allowed module, so an allowed module
cannot be used as a trampoline to something it merely imported.
"""
import importlib
import sys
import types

from .. import codec
from .errors import RefusedCallError

__all__ = ["ref_of", "resolve", "module_allowed"]


def ref_of(func):
    """``module:qualname`` of a function or class; TypeError for anything else."""
    if isinstance(func, str):
        if ":" not in func:
            raise TypeError(f"a callable reference must be 'module:qualname', not {func!r}")
        return func
    mod = getattr(func, "__module__", None)
    qual = getattr(func, "__qualname__", None)
    if mod is None or qual is None or "<" in qual:
        raise TypeError(
            f"{func!r} cannot be called remotely: only module-level functions, classes and "
            "their methods travel (by 'module:qualname'); lambdas and local functions do not")
    return f"{mod}:{qual}"


def module_allowed(module, allowed):
    for a in allowed:
        if module == a or module.startswith(a + "."):
            return True
    return False


def resolve(ref, allowed):
    """Return the object named by ``ref`` if its module is allowed; RefusedCallError otherwise."""
    if not isinstance(ref, str) or ref.count(":") != 1:
        raise RefusedCallError(f"malformed callable reference {ref!r}")
    module, _, qual = ref.partition(":")
    parts = qual.split(".")
    if not module or not qual or any(not p or p.startswith("__") for p in parts) \
            or not all(m.isidentifier() for m in module.split(".")):
        raise RefusedCallError(f"malformed or private callable reference {ref!r}")
    if not module_allowed(module, allowed):
        raise RefusedCallError(
            f"{ref!r} refused: module {module!r} is not on this worker's allowlist "
            f"{sorted(allowed)}; name it in init_rpc's rpc_backend_options.allowed_modules")
    try:
        obj = sys.modules.get(module)
        if obj is None or getattr(getattr(obj, "__spec__", None), "_initializing", False):
            obj = importlib.import_module(module)  # waits for another thread's import
        for p in parts:
            obj = getattr(obj, p)
    except (ImportError, AttributeError) as e:
        raise RefusedCallError(f"{ref!r} cannot be resolved on this worker: {e}") from None
    home = getattr(obj, "__module__", None)
    if isinstance(home, str) and not module_allowed(home, allowed):
        raise RefusedCallError(
            f"{ref!r} refused: it resolves to an object of module {home!r}, which is not allowed")
    if not callable(obj):
        raise RefusedCallError(f"{ref!r} is not callable")
    return obj


def _encode_function(fn, enc):
    if not getattr(enc.context, "functions_by_reference", False):
        raise TypeError(f"{fn!r} cannot be sent or saved here: functions and classes "
                        "travel by reference over RPC only")
    return ref_of(fn)


def _decode_function(ref, dec):
    resolver = getattr(dec.context, "resolve", None)
    if resolver is None:
        raise codec.CodecError("functions are not accepted here")
    if type(ref) is not str:
        raise codec.CodecError("malformed function reference")
    return resolver(ref)


codec.register((types.FunctionType, types.BuiltinFunctionType, type), 12, _encode_function,
               _decode_function)

"""``distgrad.save`` / ``distgrad.load``: checkpoints in the value codec's format (no pickle).

A file is one msgpack array ``[magic, version, data]`` where ``data`` is what
:func:`distgrad.codec.dumps` makes of the object: tensors, arrays, containers
(dict, list, tuple), numbers, strings, dtypes, and whole ``nn.Module`` s (their
class by reference, their state; see :mod:`distgrad.nn.modules.module_codec`).
Other objects are refused on save (TypeError naming the type).

Loading never runs code: a module is rebuilt without calling anything of its
class. Which classes (and functions held by a module's attributes) a file may
name is the caller's choice, as ``torch.load``'s ``weights_only`` is:

* always distgrad's own (``distgrad.*``);
* the modules named in ``allowed_modules`` (and their submodules), imported if
  need be: ``distgrad.load(f, allowed_modules=["mymodels"])``;
* with ``weights_only=False`` (the file is trusted), any module this process has
  already imported, ``__main__`` included; load never imports a new one then;
* the functions and classes given to ``add_safe_globals`` (process-wide) or to the
  ``safe_globals`` context manager, PyTorch's allowlist for ``weights_only`` loads:
  each exactly (not its module), under its own name or the one given with it.

Anything else raises ``pickle.UnpicklingError`` (PyTorch's class for a refused
global) saying what to allow.
"""
import importlib
import threading
# PyTorch's exception class for a refused load; nothing in this module unpickles.
from pickle import UnpicklingError

from .references import canonical_module, loaded_module, lookup, reference_of, split_reference

__all__ = ["save", "load", "add_safe_globals", "safe_globals", "get_safe_globals",
           "clear_safe_globals"]

_MAGIC = "distgrad-checkpoint"
_VERSION = 2


def _is_path(f):
    return isinstance(f, (str, bytes)) or hasattr(f, "__fspath__")


def save(obj, f):
    """Write ``obj`` (a state_dict, tensors, containers) to a path or a binary file."""
    import msgpack
    from . import codec
    try:
        data = codec.dumps(obj)
    except (TypeError, codec.CodecError) as e:  # the codec's message names the type
        raise type(e)(f"distgrad.save: {e}") from None
    blob = msgpack.packb([_MAGIC, _VERSION, data])
    if _is_path(f):
        with open(f, "wb") as fh:
            fh.write(blob)
    else:
        f.write(blob)


# ------------------------------------------------------------ PyTorch's safe globals
_safe = []                  # [(object, the name a checkpoint calls it by)]
_safe_lock = threading.Lock()


def _entry(item):
    """``(object, "module:qualname")`` of ``fn`` or ``(fn, "module.qualname")``."""
    if isinstance(item, tuple):
        if len(item) != 2 or not isinstance(item[1], str) or "." not in item[1]:
            raise TypeError(f"a safe global given with its name must be (callable, "
                            f"'module.qualname'), not {item!r}")
        obj, dotted = item
        module, _, qual = dotted.rpartition(".")
        return obj, f"{canonical_module(module)}:{qual}"
    return item, reference_of(item)


def add_safe_globals(safe_globals):
    """Allow these functions and classes in every later ``load`` (``weights_only``), as
    ``torch.serialization.add_safe_globals``. An entry is the object, or ``(object,
    "module.qualname")`` for an object a checkpoint names differently."""
    entries = [_entry(item) for item in safe_globals]
    with _safe_lock:
        _safe.extend(e for e in entries if e not in _safe)


def get_safe_globals():
    """What ``add_safe_globals`` allowed (objects, or (object, name) where a name was given)."""
    with _safe_lock:
        return [obj if ref == _default_ref(obj) else (obj, ref.replace(":", "."))
                for obj, ref in _safe]


def _default_ref(obj):
    try:
        return reference_of(obj)
    except TypeError:
        return None


def clear_safe_globals():
    with _safe_lock:
        _safe.clear()


class safe_globals:  # noqa: N801 - PyTorch's name
    """``with safe_globals([...]):`` allows these for the loads inside the block only."""

    def __init__(self, safe_globals):
        self.entries = [_entry(item) for item in safe_globals]
        self.added = []

    def __enter__(self):
        with _safe_lock:
            self.added = [e for e in self.entries if e not in _safe]
            _safe.extend(self.added)
        return self

    def __exit__(self, *exc):
        with _safe_lock:
            for e in self.added:
                if e in _safe:
                    _safe.remove(e)
        return False


def _safe_global(ref):
    with _safe_lock:
        for obj, name in _safe:
            if name == ref:
                return obj
    return None


class _Trust:
    """``distgrad.load``'s decoding context: resolves the references a checkpoint holds."""

    def __init__(self, allowed_modules, trust_imported):
        self.allowed = tuple(canonical_module(m) for m in allowed_modules)
        self.trust_imported = trust_imported

    def resolve(self, ref):
        allowed = _safe_global(ref) if isinstance(ref, str) else None
        if allowed is not None:
            return allowed
        try:
            module_name, _ = split_reference(ref)
        except ValueError as e:
            raise UnpicklingError(f"Weights only load failed: {e}") from None
        module = self._module(ref, module_name)
        try:
            return lookup(ref, module)
        except LookupError as e:
            raise UnpicklingError(f"Weights only load failed: {e}") from None

    def _module(self, ref, name):
        named = any(name == a or name.startswith(a + ".") for a in self.allowed)
        if name == "distgrad" or name.startswith("distgrad.") or named:
            module = loaded_module(name)
            if module is not None:
                return module
            try:
                return importlib.import_module(name)
            except ImportError as e:
                raise UnpicklingError(f"cannot load {ref!r}: {e}") from None
        if self.trust_imported:
            module = loaded_module(name)
            if module is None:
                raise UnpicklingError(
                    f"cannot load {ref!r}: module {name!r} is not imported in this process "
                    "(distgrad.load never imports one on its own); import it first or pass "
                    f"allowed_modules=[{name!r}]")
            return module
        raise UnpicklingError(
            f"Weights only load failed: the checkpoint holds {ref!r}, and module {name!r} is "
            "not allowed by default. If you trust the file, load it with weights_only=False "
            "(classes of modules already imported), allow the class "
            "(distgrad.serialization.add_safe_globals([...]) or the safe_globals context "
            f"manager), or allow the module: distgrad.load(f, allowed_modules=[{name!r}])")


def load(f, map_location=None, pickle_module=None, *, weights_only=None, mmap=None,
         allowed_modules=(), **pickle_load_args):
    """Read what :func:`save` wrote; tensors come back writable and detached from the file.

    ``weights_only`` (default True) and ``allowed_modules`` say which classes a saved
    module may be of (see the module docstring). ``map_location`` (every tensor is on
    the CPU), ``pickle_module``, ``mmap`` and extra pickle arguments are accepted for
    PyTorch's signature and ignored: nothing is unpickled.
    """
    if isinstance(allowed_modules, str):
        raise TypeError("allowed_modules must be a list of module names, not a string")
    trust = _Trust(allowed_modules, trust_imported=weights_only is False)
    import msgpack
    from . import codec
    name = getattr(f, "name", f)
    if _is_path(f):
        with open(f, "rb") as fh:
            blob = fh.read()
    else:
        blob = f.read()
    try:
        magic, version, data = msgpack.unpackb(blob, raw=False)
    except Exception:  # noqa: BLE001 - any malformation is the same error for the user
        raise RuntimeError(f"{name!r} is not a distgrad checkpoint") from None
    if magic != _MAGIC or version != _VERSION:
        raise RuntimeError(f"{name!r} is not a distgrad checkpoint of version {_VERSION}")
    try:
        return _writable(codec.loads(data, trust))
    except codec.CodecError as e:
        raise RuntimeError(f"{name!r} is a damaged distgrad checkpoint: {e}") from None


def _writable(obj):
    """Decoded arrays are read-only views of the file's bytes; give each its own copy."""
    from .autograd._internal import array_of, set_array
    from ._tensor import Tensor
    import numpy as np
    if isinstance(obj, Tensor):
        set_array(obj, array_of(obj).copy())
        return obj
    if isinstance(obj, np.ndarray):
        return obj.copy()
    if isinstance(obj, dict):
        return {k: _writable(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_writable(v) for v in obj]
    if isinstance(obj, tuple):
        return tuple(_writable(v) for v in obj)
    return obj

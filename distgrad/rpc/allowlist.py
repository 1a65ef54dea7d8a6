"""What a worker runs for its peers: references resolved against an allowlist.

Nothing that arrives over a socket is unpickled or evaluated. A callable travels
as ``"module:qualname"`` and resolves only to

* a function or class *defined in* an allowed module (the user's
  ``allowed_modules``, their submodules, the module that called ``init_rpc``,
  and the program's own modules: see :func:`program_module`): the object's own
  ``__module__`` and ``__qualname__`` must be the reference, for every kind of
  object, C types included, so an allowed module cannot serve as a trampoline to
  something it imported; a class method travels bound to the class it was
  taken from (``Cls.method``), which must be allowed, as must the class in its
  hierarchy that defines the method; or
* one of distgrad's own entry points: the public ops, tensor factories, layers,
  losses, initialisers and optimizers (see :func:`default_entry_points`), and
  the internal functions that distributed autograd, RemoteModule and
  DistributedOptimizer call on workers (marked :func:`entry_point`). File
  writers (``save``), process starters and test helpers are not among them.

The attribute path never passes through a module object or a dunder name, and
only allowed modules are imported while resolving. A method called through an
RRef must be defined by an allowed class in the value's own class hierarchy;
an RRef's value may not be a module, a class or a function.
"""
import importlib
import importlib.machinery
import inspect
import os
import site
import sys
import sysconfig
import threading
import types

from .. import codec
from .errors import RefusedCallError

__all__ = ["Allowlist", "ref_of", "entry_point", "register_entry_point_modules",
           "default_entry_points", "module_allowed", "program_module", "ADVICE_ENV"]

#: How a refusal tells to allow a module ("{module}": the refused one). A harness that
#: starts worlds its own way (the pytest plugin) says what its users set instead: in
#: this variable for the workers it starts, in ``Allowlist.advice`` for its own process.
ADVICE_ENV = "DISTGRAD_ALLOW_ADVICE"
_ADVICE = ("RpcBackendOptions(allowed_modules=['{module}']) in init_rpc, or "
           "`distgrad worker --allow {module}` (env DISTGRAD_ALLOWED_MODULES)")

#: Modules whose functions marked with :func:`entry_point` peers may call (importing them
#: to resolve a reference is safe). The layers above this one that hold such functions
#: (distributed autograd, RemoteModule, DistributedOptimizer) register their modules with
#: :func:`register_entry_point_modules` when they are imported.
_entry_point_modules = set()

#: Namespaces whose public functions and classes are the default entry points.
_PUBLIC_NAMESPACES = ("distgrad", "distgrad.nn", "distgrad.nn.functional", "distgrad.nn.init",
                      "distgrad.optim", "distgrad.optim.lr_scheduler", "distgrad.distributions",
                      "distgrad.linalg", "distgrad.sparse")

#: The modules those entry points may be defined in: math, layers, optimizers, the tensor
#: itself. Anything else a public namespace re-exports stays out (``save``/``load`` write
#: files; process starters, test helpers and the environment are not reachable), and so
#: does any other module of distgrad while a reference is resolved.
_PUBLIC_ORIGINS = ("distgrad.autograd", "distgrad.ops", "distgrad.sparse", "distgrad.linalg",
                   "distgrad._tensor", "distgrad._tensor_str", "distgrad.threads",
                   "distgrad.compiler", "distgrad.nn", "distgrad.optim", "distgrad.distributions")

#: ``operator``'s side-effect-free functions (its classes build callables; not included).
_OPERATOR_FUNCTIONS = ("abs", "add", "and_", "concat", "contains", "eq", "floordiv", "ge",
                       "getitem", "gt", "index", "inv", "invert", "is_", "is_not", "le",
                       "lshift", "lt", "matmul", "mod", "mul", "ne", "neg", "not_", "or_",
                       "pos", "pow", "rshift", "sub", "truediv", "truth", "xor")

#: Dunder methods an RRef proxy may call (``rref.rpc_sync()(x)``, indexing, ``len``).
_RREF_DUNDERS = frozenset(("__call__", "__getitem__", "__len__", "__contains__"))

_MAIN_NAMES = ("__main__", "__mp_main__")  # a script's module in its parent and its spawned children


def _canonical(module):
    """``__mp_main__`` (the script's module in a spawned child) is ``__main__`` on the wire."""
    return "__main__" if module in _MAIN_NAMES else module


def entry_point(fn):
    """Mark a function of a registered entry-point module as callable by peers."""
    fn.__distgrad_entry_point__ = True
    return fn


def register_entry_point_modules(*modules):
    """Let peers call the :func:`entry_point` functions of ``modules`` (names; each is
    imported when a reference first needs it)."""
    _entry_point_modules.update(modules)


def _within(module, prefixes):
    return any(module == p or module.startswith(p + ".") for p in prefixes)


def ref_of(func):
    """``module:qualname`` of a function, a class, or a method bound to a class (a class
    method, named through the class it was taken from); TypeError for anything else."""
    if isinstance(func, str):
        if func.count(":") != 1:
            raise TypeError(f"a callable reference must be 'module:qualname', not {func!r}")
        return func
    if isinstance(func, types.MethodType) and isinstance(func.__self__, type):
        owner = func.__self__
        return f"{ref_of(owner)}.{func.__name__}"
    mod = getattr(func, "__module__", None)
    qual = getattr(func, "__qualname__", None)
    if not isinstance(mod, str) or not isinstance(qual, str) or "<" in qual:
        raise TypeError(
            f"{func!r} cannot be called remotely: only module-level functions, classes and "
            "their methods travel (by 'module:qualname'); lambdas, local functions and "
            "bound methods do not")
    return f"{_canonical(mod)}:{qual}"


def module_allowed(module, allowed):
    return _within(_canonical(module), allowed)


def _program_root():
    """The directory the running program's own modules come from: the main script's
    directory, or for ``python -m pkg.mod`` the directory holding ``pkg``; None when the
    program is no file (``-c``, an interactive session)."""
    main = sys.modules.get("__main__")
    path = getattr(main, "__file__", None)
    if not path:
        return None
    root = os.path.dirname(os.path.realpath(path))
    spec = getattr(main, "__spec__", None)
    name = getattr(spec, "name", None) or ""
    if name and name not in _MAIN_NAMES:  # run as a module: climb to its top package's parent
        for _ in range(name.count(".")):
            root = os.path.dirname(root)
    return root


_shared_dirs = None
_shared_dirs_lock = threading.Lock()


def _shared_code_dirs():
    """Where the standard library, installed packages and distgrad itself live; found once,
    under a lock: ``sysconfig.get_paths()`` fills its module-wide variables on first use,
    and two handler threads asking at once made one of them fail ("dictionary changed size
    during iteration"; a 64-rank all-to-all lost a process to it)."""
    global _shared_dirs
    with _shared_dirs_lock:
        if _shared_dirs is None:
            _shared_dirs = _find_shared_code_dirs()
        return _shared_dirs


def _find_shared_code_dirs():
    dirs = set()
    for key in ("stdlib", "platstdlib", "purelib", "platlib"):
        path = sysconfig.get_paths().get(key)
        if path:
            dirs.add(path)
    dirs.update(getattr(site, "getsitepackages", lambda: [])())
    user_site = getattr(site, "getusersitepackages", lambda: None)()
    if user_site:
        dirs.add(user_site)
    dirs.update({sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix})
    dirs.add(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # distgrad's
    return [os.path.realpath(d) for d in dirs if d]


def _inside(path, directory):
    return path == directory or path.startswith(directory.rstrip(os.sep) + os.sep)


def program_module(name):
    """Whether module ``name`` is one of the running program's own: already imported (the
    program imported it; nothing is imported because a peer asks), loaded from a file
    under the program's directory (see :func:`_program_root`), and not from the standard
    library, an installed package (site-packages, also inside the program's directory)
    or distgrad. Such modules are allowed by default, as a module in the script's
    directory is under PyTorch."""
    module = sys.modules.get(name)
    path = getattr(module, "__file__", None)
    root = _program_root()
    if not path or root is None:
        return False
    path = os.path.realpath(path)
    if not _inside(path, root) or any(part in ("site-packages", "dist-packages")
                                      for part in path.split(os.sep)):
        return False
    shared = _shared_code_dirs()
    return not any(_inside(root, d) or _inside(path, d) for d in shared)


def _in_program_directory(module):
    """Whether ``module``'s top package would be found in the program's directory (a
    lookup only: nothing is imported or run)."""
    root = _program_root()
    if root is None:
        return False
    try:
        spec = importlib.machinery.PathFinder.find_spec(module.split(".")[0], [root])
    except (ImportError, ValueError):
        return False
    return spec is not None


_defaults = None
_defaults_lock = threading.Lock()


def default_entry_points():
    """{id: object} of distgrad's public API callable by peers (computed once)."""
    global _defaults
    with _defaults_lock:
        if _defaults is None:
            found = {}
            for ns_name in _PUBLIC_NAMESPACES:
                try:
                    ns = importlib.import_module(ns_name)
                except ImportError:  # an optional part not present in this build
                    continue
                for name in getattr(ns, "__all__", None) or dir(ns):
                    if name.startswith("_"):
                        continue
                    obj = getattr(ns, name, None)
                    if _public_entry(obj):
                        found[id(obj)] = obj
            import operator
            for name in _OPERATOR_FUNCTIONS:
                obj = getattr(operator, name)
                found[id(obj)] = obj
            _defaults = found
    return _defaults


def _public_entry(obj):
    if not (inspect.isfunction(obj) or inspect.isclass(obj) or inspect.isbuiltin(obj)):
        return False
    mod = getattr(obj, "__module__", None)
    return isinstance(mod, str) and _within(mod, _PUBLIC_ORIGINS)


class Allowlist:
    """One process's rule for references from peers; resolutions are cached."""

    def __init__(self, allowed_modules=()):
        self.modules = tuple(dict.fromkeys(_canonical(m) for m in allowed_modules))
        self.advice = os.environ.get(ADVICE_ENV) or _ADVICE
        self._cache = {}
        self._lock = threading.Lock()

    def prepare(self):
        """Find what checking references needs, once per process: where the standard
        library and installed packages live (``sysconfig``: 4 ms). Done when the agent
        starts; found on first need instead, it held up the first call of each process
        in a world that carries a distributed autograd context (its installer is checked
        on the I/O thread, where every message of that process waits)."""
        _shared_code_dirs()

    def extend(self, modules):
        with self._lock:
            self.modules = tuple(dict.fromkeys(self.modules + tuple(_canonical(m) for m in modules)))
            self._cache.clear()

    # -------------------------------------------------------------- references
    def resolve(self, ref):
        """The function or class ``ref`` names; :class:`RefusedCallError` if not allowed."""
        fn = self._cache.get(ref)
        if fn is None:
            fn = self._resolve(ref)
            with self._lock:
                if len(self._cache) < 4096:
                    self._cache[ref] = fn
        return fn

    def _resolve(self, ref):
        if not isinstance(ref, str) or ref.count(":") != 1 or len(ref) > 512:
            raise RefusedCallError(f"malformed callable reference {ref!r}")
        module, _, qual = ref.partition(":")
        parts = qual.split(".")
        if not module or any(not p.isidentifier() or p.startswith("__") for p in parts) \
                or not all(m.isidentifier() for m in module.split(".")):
            raise RefusedCallError(f"malformed or private callable reference {ref!r}")
        user = module_allowed(module, self.modules) or program_module(module)
        if not user and not self._entry_module(module):
            raise RefusedCallError(self._refusal(ref, module))
        obj = _import(ref, module)
        owner = None
        for i, p in enumerate(parts):
            try:  # static lookup: no module __getattr__, no descriptors run
                found = inspect.getattr_static(obj, p)
            except AttributeError:
                hint = ("; a `distgrad worker` process runs no script of yours, so functions "
                        "defined in the caller's script do not exist there: move them into a "
                        "module and allow it (--allow)" if module == "__main__" else "")
                raise RefusedCallError(f"{ref!r} cannot be resolved on this worker: "
                                       f"{module!r} has no attribute {qual!r}{hint}") from None
            if isinstance(found, classmethod) and i == len(parts) - 1 \
                    and isinstance(obj, type):
                return self._class_method(ref, obj, p, module, ".".join(parts[:-1]))
            obj = found.__func__ if isinstance(found, (staticmethod, classmethod)) else found
            if isinstance(obj, types.ModuleType):
                raise RefusedCallError(f"{ref!r} refused: {p!r} is a module; a reference "
                                       "names a function or class defined in its module")
        if self._is_entry_point(obj):
            return obj
        if user and _defined_as(obj, module, qual):
            return obj
        if user:
            raise RefusedCallError(
                f"{ref!r} refused: it resolves to {_describe(obj)}, not a function or class "
                f"defined in {module!r}")
        raise RefusedCallError(f"{ref!r} refused: not one of distgrad's remote entry points")

    def _class_method(self, ref, cls, name, module, cls_qual):
        """``cls.name``, a class method, bound to ``cls`` (the class the caller took it
        from): ``cls`` must be allowed and so must the class that defines the method."""
        if not (self.class_allowed(cls) and _defined_as(cls, module, cls_qual)):
            raise RefusedCallError(f"{ref!r} refused: {module}.{cls_qual} is not a class "
                                   "defined in an allowed module")
        for klass in cls.__mro__:
            if name in vars(klass):
                if not (self.class_allowed(klass) or self._distgrad_class(klass)):
                    raise RefusedCallError(
                        f"{ref!r} refused: the method is defined by {klass.__module__}."
                        f"{klass.__qualname__}, which is not allowed on this worker")
                return getattr(cls, name)
        raise RefusedCallError(f"{ref!r} cannot be resolved on this worker")

    def _base_of_allowed(self, cls, klass):
        """Whether ``klass`` is one of the method sets distgrad assembles an allowed class of
        ``cls``'s hierarchy from (``distgrad.Tensor``'s: ops, sparse, sharing): its methods
        are that class's."""
        return self._distgrad_class(klass) and any(
            c is not klass and issubclass(c, klass) and self.class_allowed(c) for c in cls.__mro__)

    def _distgrad_class(self, klass):
        """A class of distgrad's own callable modules (``Function.apply`` of a program's
        ``autograd.Function``, say): its class methods run the program's allowed code."""
        mod = getattr(klass, "__module__", "")
        return isinstance(mod, str) and mod.startswith("distgrad.") and self._entry_module(mod)

    def _entry_module(self, module):
        """Whether ``module`` may hold default entry points (so importing it is safe)."""
        if module in ("operator", "_operator"):
            return True
        return module == "distgrad" or module in _entry_point_modules or \
            _within(module, _PUBLIC_ORIGINS)

    def _is_entry_point(self, obj):
        # the marker first: distgrad's own entry points (distributed autograd's, resolved on
        # the I/O thread) must not wait for the public API's table, which imports every
        # public namespace the first time (30 ms; a coordinator's first backward waited)
        if getattr(obj, "__distgrad_entry_point__", False) is True and inspect.isfunction(obj) \
                and obj.__module__ in _entry_point_modules:
            return True
        return id(obj) in default_entry_points()

    def _refusal(self, ref, module):
        unimported = ""
        if module not in sys.modules and _in_program_directory(module):
            unimported = (f" It is a module of the program's directory that this worker has "
                          "not imported: the program's own modules are allowed once the "
                          "program imports them (at the top of the script, say).")
        return (f"{ref!r} refused: module {module!r} is not on this worker's allowlist "
                f"{sorted(self.modules)}.{unimported} Allow it on every worker of the world: "
                + self.advice.replace("{module}", module))

    # -------------------------------------------------------------- RRef values
    def class_allowed(self, cls):
        if id(cls) in default_entry_points():
            return True
        mod = getattr(cls, "__module__", None)
        return isinstance(mod, str) and (module_allowed(mod, self.modules)
                                         or program_module(mod)) \
            and _defined_as(cls, _canonical(mod), cls.__qualname__)

    def method(self, value, name):
        """The bound method ``name`` of an RRef's value, if its defining class is allowed."""
        if not isinstance(name, str) or not name.isidentifier() or (
                name.startswith("__") and name not in _RREF_DUNDERS):
            raise RefusedCallError(f"method {name!r} may not be called through an RRef")
        for klass in type(value).__mro__:
            if name in vars(klass):
                attr = vars(klass)[name]
                if not (self.class_allowed(klass) or self._base_of_allowed(type(value), klass)):
                    raise RefusedCallError(
                        f"method {name!r} refused: it is defined by {klass.__module__}."
                        f"{klass.__qualname__}, which is not allowed on this worker")
                if not (inspect.isfunction(attr) or isinstance(attr, (staticmethod, classmethod))):
                    raise RefusedCallError(f"{klass.__qualname__}.{name} is not a method")
                return getattr(value, name)
        raise RefusedCallError(f"{type(value).__qualname__} has no method {name!r}")

    @staticmethod
    def check_value(value, what):
        """Refuse values that would let a peer reach code: modules, classes, functions."""
        if isinstance(value, (types.ModuleType, type)) or inspect.isroutine(value) \
                or isinstance(value, types.MethodWrapperType):
            raise RefusedCallError(f"{what} returned {_describe(value)}; modules, classes and "
                                   "functions cannot be held by an RRef")
        return value


def _import(ref, module):
    name = "__main__" if module == "__main__" else module
    obj = sys.modules.get(name)
    if obj is None or getattr(getattr(obj, "__spec__", None), "_initializing", False):
        try:
            obj = importlib.import_module(name)  # waits for another thread's import
        except ImportError as e:
            raise RefusedCallError(f"{ref!r} cannot be resolved on this worker: {e}") from None
    return obj


def _defined_as(obj, module, qual):
    """Whether ``obj`` is a function or class whose own name is ``module:qual``."""
    if not (inspect.isfunction(obj) or inspect.isclass(obj) or inspect.isbuiltin(obj)):
        return False
    own_mod = getattr(obj, "__module__", None)
    own_qual = getattr(obj, "__qualname__", None)
    return isinstance(own_mod, str) and _canonical(own_mod) == module and own_qual == qual


def _describe(obj):
    t = type(obj)
    return f"a {t.__module__}.{t.__qualname__}"


# ---------------------------------------------------------------------- the codec
def _encode_function(fn, enc):
    if not getattr(enc.context, "functions_by_reference", False):
        raise TypeError(f"{fn!r} cannot be sent or saved here: functions and classes "
                        "travel by reference over RPC only")
    return ref_of(fn)


def _decode_function(ref, dec):
    return dec.resolve(ref)


codec.register((types.FunctionType, types.BuiltinFunctionType, type, types.MethodType), 12,
               _encode_function, _decode_function)

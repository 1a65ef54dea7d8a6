"""Offloading policies: which saved tensors leave the process.

A policy is a plain object (and a TOML table with the same keys)::

    [offload.policy]
    min_bytes = 1048576                 # smaller saved tensors stay in memory
    exclude_modules = ["head", "*Norm"] # names (glob) or class names: keep what they save
    modules = []                        # if given: offload only inside these
    exclude_ops = ["Embedding*"]        # by the op that produced the tensor
    ops = []                            # if given: offload only what these produced
    every_nth_layer = 2                 # offload in layers 0, 2, 4, ... only
    layers = ["blocks.*"]               # what counts as a layer (default: the model's children)

Parameters, buffers and other leaves (and views of them) are never offloaded,
whatever the policy says: their owner holds them anyway, so offloading them frees
nothing and costs a write and a read per step (the "weights offloaded by
mistake" failure of other offloaders).

Module names are the qualified names of ``model.named_modules()`` for the model
given to the hook object; without a model only class names match. An op is the
``grad_fn`` class of the saved tensor's producer (``TanhBackward0``), matched
also by its short name (``tanh``): for a node's own output that is the saving op.
"""
import fnmatch
import re

__all__ = ["OffloadPolicy", "load_toml_table"]

_BACKWARD_SUFFIX = re.compile(r"Backward\d*$")


def _patterns(name, value):
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, (list, tuple)) or not all(isinstance(p, str) and p for p in value):
        raise TypeError(f"{name} must be a list of non-empty strings, got {value!r}")
    return tuple(value)


def _match(patterns, *names):
    return any(fnmatch.fnmatchcase(n, p) for p in patterns for n in names if n is not None)


class OffloadPolicy:
    """Which saved tensors a hook object offloads (see the module docstring).

    >>> policy = OffloadPolicy(min_bytes=1 << 20, exclude_modules=["head"])
    >>> policy.min_bytes
    1048576
    >>> OffloadPolicy.from_dict({"min_bytes": 4096, "every_nth_layer": 2}).every_nth_layer
    2
    """

    KEYS = ("min_bytes", "modules", "exclude_modules", "ops", "exclude_ops", "every_nth_layer",
            "layers")

    def __init__(self, *, min_bytes=0, modules=(), exclude_modules=(), ops=(), exclude_ops=(),
                 every_nth_layer=1, layers=()):
        if isinstance(min_bytes, bool) or not isinstance(min_bytes, int) or min_bytes < 0:
            raise ValueError(f"min_bytes must be an integer >= 0, got {min_bytes!r}")
        if isinstance(every_nth_layer, bool) or not isinstance(every_nth_layer, int) \
                or every_nth_layer < 1:
            raise ValueError(f"every_nth_layer must be an integer >= 1, got {every_nth_layer!r}")
        self.min_bytes = min_bytes
        self.modules = _patterns("modules", modules)
        self.exclude_modules = _patterns("exclude_modules", exclude_modules)
        self.ops = _patterns("ops", ops)
        self.exclude_ops = _patterns("exclude_ops", exclude_ops)
        self.every_nth_layer = every_nth_layer
        self.layers = _patterns("layers", layers)

    @classmethod
    def from_dict(cls, table, source="offload policy"):
        """A policy from a mapping (a TOML table); errors name the key and ``source``."""
        if not isinstance(table, dict):
            raise ValueError(f"{source}: the policy must be a table, got {type(table).__name__}")
        for key in table:
            if key not in cls.KEYS:
                raise ValueError(f"{source}: unknown key {key!r} in the offload policy "
                                 f"(known: {', '.join(cls.KEYS)})")
        try:
            return cls(**table)
        except (TypeError, ValueError) as e:
            raise ValueError(f"{source}: {e}") from None

    def as_dict(self):
        return {k: list(v) if isinstance(v, tuple) else v for k, v in
                ((k, getattr(self, k)) for k in self.KEYS)}

    def __repr__(self):
        changed = {k: v for k, v in self.as_dict().items()
                   if v != OffloadPolicy().as_dict()[k]}
        return "OffloadPolicy(" + ", ".join(f"{k}={v!r}" for k, v in changed.items()) + ")"

    def __eq__(self, other):
        return isinstance(other, OffloadPolicy) and self.as_dict() == other.as_dict()

    # ------------------------------------------------------------ decisions
    @property
    def tracks_modules(self):
        """Whether decisions need the module stack (module rules or layer counting)."""
        return bool(self.modules or self.exclude_modules or self.every_nth_layer > 1)

    def is_layer(self, module, name, is_child_of_model):
        if self.layers:
            return _match(self.layers, name, type(module).__name__)
        return is_child_of_model

    def wants(self, tensor, nbytes, modules=(), layer_index=None):
        """Whether to offload ``tensor`` (``nbytes`` stored), saved inside ``modules``
        (``(module, qualified name or None)`` pairs, outermost first) in layer
        ``layer_index`` (None outside any layer)."""
        if nbytes < self.min_bytes or nbytes == 0:
            return False
        if self.ops or self.exclude_ops:
            fn = tensor.grad_fn
            op = type(fn).__name__ if fn is not None else None
            short = _BACKWARD_SUFFIX.sub("", op).lower() if op else None
            if self.exclude_ops and _match(self.exclude_ops, op, short):
                return False
            if self.ops and not _match(self.ops, op, short):
                return False
        if self.exclude_modules and any(_match(self.exclude_modules, name, type(m).__name__)
                                        for m, name in modules):
            return False
        if self.modules and not any(_match(self.modules, name, type(m).__name__)
                                    for m, name in modules):
            return False
        if layer_index is not None and layer_index % self.every_nth_layer:
            return False
        return True


def load_toml_table(path, table=None):
    """Read TOML file ``path`` and return the table at dotted path ``table`` (or all of it)."""
    try:
        import tomllib
    except ImportError:  # Python 3.10
        import tomli as tomllib
    with open(path, "rb") as f:
        try:
            data = tomllib.load(f)
        except tomllib.TOMLDecodeError as e:
            raise ValueError(f"{path}: not valid TOML: {e}") from None
    if table:
        for part in table.split("."):
            if not isinstance(data, dict) or part not in data:
                raise ValueError(f"{path}: no table [{table}]")
            data = data[part]
    return data

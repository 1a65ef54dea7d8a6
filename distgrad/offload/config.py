"""Hook objects from configuration: one TOML table describes where activations go.

::

    [offload]
    kind = "tiered"              # "none", "disk", "remote" or "tiered"
    directory = "/scratch"       # disk, tiered: where the per-run directory goes
    read = "read"                # disk, tiered: "read" or "mmap"
    store = "tcp://127.0.0.1:5555"  # remote; tiered: overflow to this store, not disk
    memory_bytes = 268435456     # tiered: bytes kept in process memory
    prefetch_bytes = 33554432    # read-ahead window of backward
    max_inflight_bytes = 33554432  # bytes on their way out before forward waits
    [offload.policy]             # see distgrad.offload.policy
    min_bytes = 65536

In a distributed pass each worker offloads its own graph segment under its own
table, sent by the coordinator with the autograd context. On the worker:
``hooks = hooks_from_config(table, f"worker {name}", namespace=context_id)`` when
the context arrives; every request of that context runs inside ``with hooks:``
(the hooks stack is per thread, so the handler thread enters it); when the
coordinator says this worker's part of backward is about to start,
``hooks.on_backward_start()`` starts reading ahead; when the context is released,
``hooks.close()`` frees what is left (in a store: the context's namespace).
"""
from .contexts import save_on_disk, save_on_remote, save_tiered
from .hooks import DEFAULT_INFLIGHT_BYTES, DEFAULT_PREFETCH_BYTES
from .policy import OffloadPolicy

__all__ = ["hooks_from_config", "check_config", "describe", "KINDS", "KEYS", "KEY_DOCS",
           "POLICY_DOCS"]

KINDS = ("none", "disk", "remote", "tiered")
_INT_KEYS = ("memory_bytes", "prefetch_bytes", "max_inflight_bytes")
#: Keys each kind accepts (besides "kind" and the "policy" table).
KEYS = {
    "none": (),
    "disk": ("directory", "read", "prefetch_bytes", "max_inflight_bytes"),
    "remote": ("store", "prefetch_bytes", "max_inflight_bytes", "timeout"),
    "tiered": ("memory_bytes", "directory", "store", "read", "prefetch_bytes",
               "max_inflight_bytes", "timeout"),
}

#: key -> (meaning, default) of an offload table, for ``--help-config``.
KEY_DOCS = {
    "kind": ('"disk", "remote", "tiered" or "none": where saved activations go',
             "default 'disk'"),
    "directory": ("disk, tiered: the folder the per-run record directory goes in",
                  "default: the temp folder"),
    "read": ('disk, tiered: "read" (into a fresh buffer) or "mmap" (map the record file)',
             "default 'read'"),
    "store": ("remote, tiered: the activation store's endpoint (`distgrad store`); tiered "
              "without it overflows to disk", "required by remote"),
    "memory_bytes": ("tiered: bytes of activations kept in process memory",
                     "required by tiered"),
    "prefetch_bytes": ("bytes backward may read ahead", f"default {DEFAULT_PREFETCH_BYTES}"),
    "max_inflight_bytes": ("bytes on their way out before forward waits",
                           f"default {DEFAULT_INFLIGHT_BYTES}"),
    "timeout": ("remote, tiered with a store: seconds one store request may take",
                "default 60"),
}
#: key -> (meaning, default) of its ``policy`` table (see distgrad.offload.policy).
POLICY_DOCS = {
    "min_bytes": ("smaller saved tensors stay in memory", "default 0"),
    "modules": ("module names (glob) or class names: offload only what these save",
                "default: every module"),
    "exclude_modules": ("module names (glob) or class names whose saved tensors stay",
                        "default none"),
    "ops": ('ops (grad_fn names such as "TanhBackward0", or "tanh"): offload only what '
            "these produced", "default: every op"),
    "exclude_ops": ("ops whose outputs stay in memory", "default none"),
    "every_nth_layer": ("offload in layers 0, n, 2n, ... only", "default 1"),
    "layers": ("module names (glob) or class names that count as layers",
               "default: the model's children"),
}


def describe(table="offload"):
    """Lines documenting the keys of an offload table named ``table`` and of its policy.

    >>> describe()[1].split()[:2]
    ['kind', '"disk",']
    """
    lines = [f"[{table}]"]
    lines += [f"  {key:20s} {doc} ({default})" for key, (doc, default) in KEY_DOCS.items()]
    lines.append(f"[{table}.policy]")
    lines += [f"  {key:20s} {doc} ({default})" for key, (doc, default) in POLICY_DOCS.items()]
    return lines


def check_config(table, source="offload config"):
    """Validate an offload table; return ``(kind, policy)``. Errors name the key and ``source``."""
    if not isinstance(table, dict):
        raise ValueError(f"{source}: the offload configuration must be a table")
    kind = table.get("kind", "disk")
    if kind not in KINDS:
        raise ValueError(f"{source}: key 'kind' must be one of {', '.join(KINDS)}, not {kind!r}")
    allowed = KEYS[kind]
    for key in table:
        if key not in ("kind", "policy") + allowed:
            raise ValueError(f"{source}: unknown key {key!r} for kind {kind!r} "
                             f"(known: kind, policy, {', '.join(allowed)})")
    for key in _INT_KEYS:
        v = table.get(key)
        if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 0):
            raise ValueError(f"{source}: key {key!r} must be an integer >= 0, got {v!r}")
    if "read" in table and table["read"] not in ("read", "mmap"):
        raise ValueError(f"{source}: key 'read' must be 'read' or 'mmap', not {table['read']!r}")
    if kind == "tiered" and "memory_bytes" not in table:
        raise ValueError(f"{source}: kind 'tiered' needs key 'memory_bytes'")
    for key in ("store", "directory"):
        if key in table and not isinstance(table[key], str):
            raise ValueError(f"{source}: key {key!r} must be a string, got {table[key]!r}")
    policy = OffloadPolicy.from_dict(table.get("policy", {}), f"{source} [policy]")
    return kind, policy


def hooks_from_config(table, source="offload config", *, model=None, namespace=None,
                      store=None):
    """The hook object a table describes (None for ``kind = "none"``).

    ``source`` names the file (and table) in error messages; ``model`` is what
    the policy's module names refer to; ``namespace`` keeps a remote store's keys
    apart (an autograd context id); ``store`` overrides the table's store (an
    endpoint, a StoreClient or an RpcStore).

    >>> hooks = hooks_from_config({"kind": "disk", "policy": {"min_bytes": 0}})
    >>> type(hooks).__name__
    'save_on_disk'
    >>> hooks.close()
    """
    kind, policy = check_config(table, source)
    if kind == "none":
        return None
    common = {"policy": policy, "model": model}
    for key in ("prefetch_bytes", "max_inflight_bytes"):
        if key in table:
            common[key] = table[key]
    store = store if store is not None else table.get("store")
    if kind == "disk":
        return save_on_disk(table.get("directory"), read=table.get("read", "read"), **common)
    if kind == "remote":
        if store is None:
            raise ValueError(f"{source}: kind 'remote' needs key 'store' (the store's endpoint)")
        return save_on_remote(store, namespace=namespace, timeout=table.get("timeout"), **common)
    return save_tiered(table["memory_bytes"], store=store, directory=table.get("directory"),
                       namespace=namespace, read=table.get("read", "read"),
                       timeout=table.get("timeout"), **common)

"""The context managers users write: ``save_on_disk``, ``save_on_remote``, ``save_tiered``.

Each is an :class:`~distgrad.offload.hooks.OffloadHooks` (a ``saved_tensors_hooks``
subclass, like PyTorch's ``save_on_cpu``) over its own tier, closed with the
object (``close()``, or when it is garbage collected).
"""
from .disk import DiskTier
from .hooks import DEFAULT_INFLIGHT_BYTES, DEFAULT_PREFETCH_BYTES, OffloadHooks
from .tiered import MemoryTier

__all__ = ["save_on_disk", "save_on_remote", "save_tiered"]


class save_on_disk(OffloadHooks):
    """Save activations to record files in a per-run directory under ``directory``.

    ``read``: ``"read"`` (into a fresh buffer) or ``"mmap"`` (map the file).

    >>> import distgrad
    >>> x = distgrad.randn(32, 32, requires_grad=True)
    >>> with save_on_disk(min_bytes=0) as hooks:
    ...     loss = x.exp().sum()
    >>> loss.backward()
    >>> hooks.close()
    """

    def __init__(self, directory=None, *, min_bytes=None, policy=None, model=None, read="read",
                 prefetch_bytes=DEFAULT_PREFETCH_BYTES, max_inflight_bytes=DEFAULT_INFLIGHT_BYTES):
        super().__init__(DiskTier(directory, read=read, max_inflight_bytes=max_inflight_bytes),
                         policy=policy, min_bytes=min_bytes, model=model,
                         prefetch_bytes=prefetch_bytes)


class save_on_remote(OffloadHooks):
    """Save activations in an activation store (``distgrad store``, or an RPC worker's role).

    ``store``: the store's endpoint (``"tcp://127.0.0.1:5555"``, ``"ipc:///..."``), a
    :class:`~distgrad.offload.store.StoreClient` to share one connection, or a
    :class:`~distgrad.offload.rpc_store.RpcStore` naming an RPC worker.
    ``namespace``: keys are kept apart per client and per namespace (an autograd
    context id, say); by default each hook object gets its own. Closing the object
    deletes its namespace's blobs in the store.
    """

    def __init__(self, store, *, namespace=None, min_bytes=None, policy=None, model=None,
                 prefetch_bytes=DEFAULT_PREFETCH_BYTES, max_inflight_bytes=DEFAULT_INFLIGHT_BYTES,
                 timeout=None):
        from .remote import remote_tier
        super().__init__(remote_tier(store, namespace=namespace, timeout=timeout,
                                     max_inflight_bytes=max_inflight_bytes),
                         policy=policy, min_bytes=min_bytes, model=model,
                         prefetch_bytes=prefetch_bytes)


class save_tiered(OffloadHooks):
    """Keep up to ``memory_bytes`` of activations in memory, the rest on disk (in
    ``directory``) or, with ``store``, in an activation store. What backward needs
    last leaves memory first."""

    def __init__(self, memory_bytes, *, store=None, directory=None, namespace=None,
                 min_bytes=None, policy=None, model=None, read="read",
                 prefetch_bytes=DEFAULT_PREFETCH_BYTES, max_inflight_bytes=DEFAULT_INFLIGHT_BYTES,
                 timeout=None):
        if store is not None:
            if directory is not None:
                raise ValueError("save_tiered takes store= or directory=, not both")
            from .remote import remote_tier
            then = remote_tier(store, namespace=namespace, timeout=timeout,
                               max_inflight_bytes=max_inflight_bytes)
        else:
            then = DiskTier(directory, read=read, max_inflight_bytes=max_inflight_bytes)
        super().__init__(MemoryTier(memory_bytes, then), policy=policy, min_bytes=min_bytes,
                         model=model, prefetch_bytes=prefetch_bytes)

"""The remote tier: offloaded bytes in an activation store (``distgrad store``).

Puts are asynchronous (acknowledged by the store; until then the bytes stay
here and serve any early read), reads are requests the prefetcher makes ahead of
backward. A store that dies, stops or refuses turns into a
:class:`~distgrad.offload.errors.StoreError` naming it when the tensor is
unpacked; never a wrong tensor, never a hang.
"""
from .errors import StoreError
from .store.blobs import new_namespace
from .tier import Tier, frame_payload

__all__ = ["RemoteTier", "remote_tier"]


class RemoteTier(Tier):
    """Records as blobs of namespace ``namespace`` in the store ``client`` talks to."""

    def __init__(self, client, namespace=None, *, owns_client=False, timeout=None,
                 max_inflight_bytes=64 << 20):
        super().__init__(max_inflight_bytes)
        self.client = client
        self.namespace = new_namespace() if namespace is None else namespace
        self.where = f"{client.endpoint} (namespace {self.namespace!r})"
        self._owns_client = owns_client
        self._timeout = timeout

    def describe(self):
        return f"activation store {self.where}"

    def _start_put(self, key, payload):
        self.client.put(self.namespace, key, payload, lambda err: self._stored(key, err))

    def _read(self, key, align):
        try:
            blob = self.client.get(self.namespace, key, self._timeout)
        except StoreError as e:
            raise StoreError(f"saved tensor {key} cannot be brought back: {e}") from None
        return frame_payload(blob, align)

    def _remove(self, key):
        self.client.delete(self.namespace, key)

    def close(self):
        if self._closed:
            return
        super().close()
        if self.client.dead is None:
            try:
                self.client.release(self.namespace, timeout=5.0)
            except StoreError:
                pass
        if self._owns_client:
            self.client.close()


def remote_tier(store, *, namespace=None, timeout=None, max_inflight_bytes=64 << 20):
    """The tier for ``store``: an endpoint string, a StoreClient, or an RpcStore."""
    from .rpc_store import RpcStore
    from .store.client import StoreClient
    if isinstance(store, RpcStore):
        return store.tier(namespace=namespace, timeout=timeout,
                          max_inflight_bytes=max_inflight_bytes)
    if isinstance(store, str):
        return RemoteTier(StoreClient(store), namespace, owns_client=True, timeout=timeout,
                          max_inflight_bytes=max_inflight_bytes)
    if isinstance(store, StoreClient):
        return RemoteTier(store, namespace, timeout=timeout, max_inflight_bytes=max_inflight_bytes)
    raise TypeError(f"store must be an endpoint string, a StoreClient or an RpcStore, not "
                    f"{type(store).__name__}")

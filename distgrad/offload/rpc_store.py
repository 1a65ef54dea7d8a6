"""The activation store as a role of an RPC worker: spare memory of one worker holds
another worker's activations, over the RPC connections the world already has.

The role is opt-in: ``distgrad.offload`` is not among the modules a worker runs
for its peers by default, so the serving worker allows this module
(``RpcBackendOptions(allowed_modules=["distgrad.offload.rpc_store"])``, or
``distgrad worker --allow distgrad.offload.rpc_store``). Then, on it (once; from
its own code, or remotely)::

    distgrad.offload.rpc_store.serve_as_store(2 << 30)

On a worker that offloads::

    store = RpcStore("worker1", memory_bytes=2 << 30)   # also enables the role there
    with save_on_remote(store, namespace=context_id):
        ...

Only public RPC calls are used (``rpc_sync``/``rpc_async`` of the module-level
functions below), so any RPC backend with PyTorch's API carries it. The role keeps
blobs in memory only: functions reachable over RPC write no files, so a put past
``memory_bytes`` is refused (an error at unpack naming the worker); put a
``save_tiered`` in front to keep part in process memory. Blobs are namespaced by
the calling worker's name and the namespace; a namespace is freed when its hook
object closes. What the RPC layer does not tell this module (a client worker that
dies) frees its blobs only at ``stop_serving`` or when the store worker exits.
"""
import threading

from .errors import StoreError
from .store.blobs import BlobStore, new_namespace
from .tier import Tier, frame_payload

__all__ = ["serve_as_store", "stop_serving", "store_put", "store_get", "store_delete",
           "store_release", "store_stats", "RpcStore", "RpcTier"]

_lock = threading.Lock()
_store = None


def _my_name():
    from ..distributed import rpc
    try:
        return rpc.get_worker_info().name
    except RuntimeError:
        return "this process"


def serve_as_store(memory_bytes):
    """Make this process an activation store of up to ``memory_bytes`` (memory only)."""
    global _store
    if isinstance(memory_bytes, bool) or not isinstance(memory_bytes, int) or memory_bytes < 0:
        raise ValueError(f"memory_bytes must be an integer >= 0, got {memory_bytes!r}")
    with _lock:
        if _store is None:
            _store = BlobStore(memory_bytes, spill_bytes=0, name=f"on worker {_my_name()}")
        else:
            _store.memory_bytes = memory_bytes
    return True


def stop_serving():
    """Free every blob and stop serving; returns how many clients had blobs."""
    global _store
    with _lock:
        store, _store = _store, None
    if store is None:
        return 0
    clients = store.stats()["clients"]
    store.close()
    return clients


def _serving():
    if _store is None:
        raise StoreError(f"worker {_my_name()} does not serve as an activation store "
                         "(call distgrad.offload.rpc_store.serve_as_store there first)")
    return _store


def store_put(client, ns, key, blob):
    with _lock:
        _serving().put(client, ns, key, blob)


def store_get(client, ns, key):
    with _lock:
        return _serving().get(client, ns, key)


def store_delete(client, ns, key):
    with _lock:
        if _store is not None:
            _store.delete(client, ns, key)


def store_release(client, ns):
    with _lock:
        return _store.release(client, ns) if _store is not None else 0


def store_stats(client=None):
    with _lock:
        return _serving().stats(client)


class RpcStore:
    """The activation store role of RPC worker ``worker`` (enabled there with
    ``memory_bytes`` if given)."""

    def __init__(self, worker, memory_bytes=None):
        from ..distributed import rpc
        self.worker = worker
        if memory_bytes is not None:
            rpc.rpc_sync(worker, serve_as_store, args=(memory_bytes,))

    def stats(self):
        from ..distributed import rpc
        return rpc.rpc_sync(self.worker, store_stats, args=(_my_name(),))

    def tier(self, namespace=None, timeout=None, max_inflight_bytes=64 << 20):
        return RpcTier(self.worker, namespace, timeout=timeout,
                       max_inflight_bytes=max_inflight_bytes)


class RpcTier(Tier):
    """Records as blobs in the store role of RPC worker ``worker``."""

    def __init__(self, worker, namespace=None, *, timeout=None, max_inflight_bytes=64 << 20):
        super().__init__(max_inflight_bytes)
        self.worker = worker
        self.namespace = new_namespace() if namespace is None else namespace
        self.client = _my_name()
        self.where = f"RPC worker {worker} (namespace {self.namespace!r})"
        self._timeout = -1 if timeout is None else timeout

    def describe(self):
        return f"activation store on {self.where}"

    def _start_put(self, key, payload):
        from ..distributed import rpc

        def done(fut, key=key):
            try:
                fut.value()
            except Exception as e:  # noqa: BLE001 - becomes the error at unpack
                self._stored(key, StoreError(f"{self.describe()} did not store saved tensor "
                                             f"{key}: {e}"))
            else:
                self._stored(key)
        try:
            fut = rpc.rpc_async(self.worker, store_put, args=(self.client, self.namespace, key,
                                                              payload))
        except Exception as e:  # noqa: BLE001 - RPC is down: the same error, later
            self._stored(key, StoreError(f"{self.describe()} is unreachable: {e}"))
            return
        fut.add_done_callback(done)

    def _read(self, key, align):
        from ..distributed import rpc
        try:
            blob = rpc.rpc_sync(self.worker, store_get, args=(self.client, self.namespace, key),
                                timeout=self._timeout)
        except Exception as e:  # noqa: BLE001 - named, whatever RPC raised
            raise StoreError(f"saved tensor {key} cannot be brought back from "
                             f"{self.describe()}: {e}") from None
        return frame_payload(blob, align)

    def _remove(self, key):
        from ..distributed import rpc
        try:
            rpc.rpc_async(self.worker, store_delete, args=(self.client, self.namespace, key))
        except Exception:  # noqa: BLE001 - RPC is down: nothing left to free
            pass

    def close(self):
        if self._closed:
            return
        super().close()
        from ..distributed import rpc
        try:
            rpc.rpc_sync(self.worker, store_release, args=(self.client, self.namespace),
                         timeout=5.0)
        except Exception:  # noqa: BLE001 - the worker or RPC is gone, and with it the blobs
            pass

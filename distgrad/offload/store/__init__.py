"""The activation store: a ZeroMQ server holding blobs for offloading clients.

``distgrad store`` (or ``python workers/store.py``) runs one; ``StoreServer`` runs
one in a thread; ``StoreClient`` talks to one. The wire format is in
:mod:`distgrad.offload.store.protocol`.
"""
from .blobs import BlobStore
from .client import StoreClient
from .server import StoreServer

__all__ = ["BlobStore", "StoreClient", "StoreServer"]

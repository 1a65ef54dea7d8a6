"""Fixtures of the offloading tests."""
import pytest


@pytest.fixture
def store_server():
    """A store served by a thread of this process (fast; death tests use a child process)."""
    from distgrad.offload.store import StoreServer
    servers = []

    def start(**kwargs):
        kwargs.setdefault("memory_bytes", 1 << 24)
        kwargs.setdefault("heartbeat_interval", 0.1)
        kwargs.setdefault("heartbeat_timeout", 1.0)
        s = StoreServer(**kwargs).start()
        servers.append(s)
        return s
    yield start
    for s in servers:
        s.close()

"""Fixtures of the offloading tests."""
import pytest


@pytest.fixture
def store_server(tmp_path):
    """A store served by a thread of this process (fast; death tests use a child process),
    spilling under ``tmp_path``."""
    from distgrad.offload.store import StoreServer
    servers = []

    def start(**kwargs):
        kwargs.setdefault("memory_bytes", 1 << 24)
        kwargs.setdefault("spill_directory", str(tmp_path))
        kwargs.setdefault("heartbeat_interval", 0.1)
        kwargs.setdefault("heartbeat_timeout", 1.0)
        s = StoreServer(**kwargs).start()
        servers.append(s)
        return s
    yield start
    for s in servers:
        s.close()

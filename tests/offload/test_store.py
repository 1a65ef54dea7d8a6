"""The activation store: budget and spill, namespacing, refusals, a store that dies or
stops, a client that dies, the ``distgrad store`` command."""
import gc
import os
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

import distgrad
from distgrad.offload import OffloadPolicy, StoreError, save_on_remote
from distgrad.offload.store import BlobStore
from distgrad.offload.store.command import spawn_store

from offload_helpers import fast_client

pytestmark = pytest.mark.timeout(60)

ALL = OffloadPolicy(min_bytes=0)
FAST = ("--heartbeat-interval", "0.1", "--heartbeat-timeout", "0.6")


def _put(client, ns, key, blob):
    errors = []
    done = []
    client.put(ns, key, blob, lambda err: (errors.append(err), done.append(1)))
    deadline = time.monotonic() + 10
    while not done and time.monotonic() < deadline:
        time.sleep(0.001)
    return errors[0] if errors else "no acknowledgement"


def test_budget_and_spill(tmp_path):
    store = BlobStore(memory_bytes=3000, spill_directory=str(tmp_path), name="test")
    blobs = [np.full(1000, i, dtype=np.uint8) for i in range(5)]
    for i, b in enumerate(blobs):
        store.put("c", "ns", i, b)
    s = store.stats()
    assert s["memory_used"] <= 3000 and s["blobs_on_disk"] == 3 and s["blobs_in_memory"] == 2
    assert set(store._memory) == {("c", "ns", 3), ("c", "ns", 4)}   # the latest stay
    for i, b in enumerate(blobs):
        assert np.array_equal(store.get("c", "ns", i), b)
    store.close()
    assert os.listdir(tmp_path) == []


def test_spill_limit_refuses():
    store = BlobStore(memory_bytes=2000, spill_bytes=0, name="tiny")
    store.put("c", "ns", 1, np.zeros(1000, np.uint8))
    with pytest.raises(StoreError, match="tiny is full"):
        store.put("c", "ns", 2, np.zeros(1000, np.uint8))
    store.close()


def test_namespaces_and_clients_are_apart(store_server):
    server = store_server()
    a, b = fast_client(server.endpoint), fast_client(server.endpoint)
    assert _put(a, "ctx", 1, np.full(10, 1, np.uint8)) is None
    assert _put(b, "ctx", 1, np.full(10, 2, np.uint8)) is None
    assert _put(a, "other", 1, np.full(10, 3, np.uint8)) is None
    assert a.get("ctx", 1).tolist() == [1] * 10
    assert b.get("ctx", 1).tolist() == [2] * 10
    assert a.get("other", 1).tolist() == [3] * 10
    assert a.release("ctx") == 1
    with pytest.raises(StoreError, match="no blob 1 in namespace 'ctx'"):
        a.get("ctx", 1)
    assert b.get("ctx", 1).tolist() == [2] * 10
    a.close()                                  # bye: a's blobs go
    deadline = time.monotonic() + 5
    while b.stats()["clients"] != 1 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert b.stats()["clients"] == 1
    b.close()


def test_hooks_free_their_blobs(store_server):
    server = store_server()
    client = fast_client(server.endpoint)
    hooks = save_on_remote(client, policy=ALL)
    x = distgrad.randn(16, 16, requires_grad=True)
    with hooks:
        loss = (x @ x).tanh().exp().sum()
    hooks.flush()
    assert client.stats()["client_blobs"] == 2
    loss.backward()
    deadline = time.monotonic() + 5
    while client.stats()["client_blobs"] and time.monotonic() < deadline:
        time.sleep(0.01)
    assert client.stats()["client_blobs"] == 0
    hooks.close()
    client.close()


def test_a_refused_put_is_an_error_at_unpack_naming_the_store(store_server):
    server = store_server(memory_bytes=1000, spill_bytes=0)
    client = fast_client(server.endpoint)
    hooks = save_on_remote(client, policy=ALL)
    x = distgrad.randn(32, 32, requires_grad=True)
    with hooks:
        loss = (x * 2).exp().sum()
    hooks.flush()
    with pytest.raises(StoreError, match=f"{server.endpoint}.*full"):
        loss.backward()
    hooks.close()
    client.close()


@pytest.mark.parametrize("how", ["kill", "stop"])
def test_a_dead_or_stopped_store_is_a_clear_error_within_the_heartbeat_bound(how):
    with spawn_store(*FAST) as (endpoint, proc):
        client = fast_client(endpoint)
        hooks = save_on_remote(client, policy=ALL, prefetch_bytes=0)
        x = distgrad.randn(16, 16, requires_grad=True)
        with hooks:
            loss = (x * 2).exp().sum()
        hooks.flush()
        try:
            proc.send_signal(signal.SIGKILL if how == "kill" else signal.SIGSTOP)
            t0 = time.monotonic()
            with pytest.raises(StoreError, match=f"store at {endpoint}"):
                while time.monotonic() - t0 < 10:   # unpack, until the loss is noticed
                    loss.backward(retain_graph=True)
                    time.sleep(0.05)
            assert time.monotonic() - t0 < 3.0
            assert client.dead
        finally:
            if how == "stop":
                proc.send_signal(signal.SIGCONT)
        del loss
        gc.collect()
        hooks.close()
        client.close()


def test_a_dead_client_s_blobs_are_freed(tmp_path):
    with spawn_store(*FAST) as (endpoint, _):
        child = textwrap.dedent(f"""
            import os, signal, numpy as np
            from distgrad.offload.store import StoreClient
            c = StoreClient({endpoint!r}, heartbeat_interval=0.1, heartbeat_timeout=0.6)
            acks = []
            for i in range(3):
                c.put("ns", i, np.zeros(1000, np.uint8), acks.append)
            while len(acks) < 3:
                pass
            print("stored", flush=True)
            os.kill(os.getpid(), signal.SIGKILL)
        """)
        proc = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True,
                              timeout=60)
        assert "stored" in proc.stdout, proc.stderr
        observer = fast_client(endpoint)
        deadline = time.monotonic() + 5
        while observer.stats()["blobs_in_memory"] and time.monotonic() < deadline:
            time.sleep(0.02)
        stats = observer.stats()
        assert stats["blobs_in_memory"] == 0 and stats["puts"] == 3
        observer.close()


def test_no_store_there_is_an_error_naming_the_endpoint():
    with pytest.raises(StoreError, match="no activation store answers at tcp://127.0.0.1:9"):
        fast_client("tcp://127.0.0.1:9", connect_timeout=0.5)


def test_store_command_checks_its_options(capsys):
    from distgrad.offload.store.command import main
    for argv, message in ((["--memory-bytes", "12X"], "'12X' is not a byte count"),
                          (["--heartbeat-interval", "2", "--heartbeat-timeout", "1"],
                           "--heartbeat-timeout must exceed"),
                          (["--heartbeat-timeout", "-1"], "must be between")):
        with pytest.raises(SystemExit) as exit_info:
            main(argv)
        assert exit_info.value.code == 2
        assert message in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["--help"])
    help_text = capsys.readouterr().out
    for word in ("DISTGRAD_STORE_MEMORY_BYTES", "default: 1G", "SECONDS"):
        assert word in help_text

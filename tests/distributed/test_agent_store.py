"""``AgentStore``: distgrad's client of PyTorch's c10d TCPStore (a torchrun agent's store),
checked against a real PyTorch TCPStore server in this process."""
import datetime
import threading

import pytest

from distgrad.distributed import DistStoreError, PrefixStore
from distgrad.distributed.agent_store import AgentStore, attempt_store, uses_agent_store

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def torch_server():
    dist = pytest.importorskip("torch.distributed")
    server = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False,
                           timeout=datetime.timedelta(seconds=20))
    yield dist, server


def test_every_operation_the_process_group_uses_agrees_with_pytorchs_clients(torch_server):
    dist, server = torch_server
    ours = AgentStore("127.0.0.1", server.port, timeout=10)
    try:
        ours.set("a", b"1")
        assert server.get("a") == b"1"                      # keys are PyTorch's keys
        server.set("b", b"2")
        assert ours.get("b") == b"2"
        assert (ours.add("n", 2), server.add("n", 3), ours.add("n", 0)) == (2, 5, 5)
        assert ours.compare_set("cs", "", "x") == b"x"       # absent and expected empty: set
        assert ours.compare_set("cs", "x", "y") == b"y"
        assert ours.compare_set("cs", "z", "w") == b"y"      # mismatch: the current value
        assert ours.check(["a", "b"]) and not ours.check(["a", "missing"])
        ours.append("ap", b"x")
        server.append("ap", b"y")
        assert ours.get("ap") == b"xy"
        ours.multi_set(["m1", "m2"], [b"1", b"2"])
        assert ours.multi_get(["m1", "m2"]) == [b"1", b"2"] == server.multi_get(["m1", "m2"])
        assert ours.delete_key("m1") is True and ours.delete_key("m1") is False
        assert ours.num_keys() == server.num_keys()
        threading.Timer(0.3, server.set, ("late", b"L")).start()
        assert ours.get("late") == b"L"                      # waits for the key
        with pytest.raises(DistStoreError, match="wait timeout"):
            ours.wait(["never"], 0.2)
        assert ours.get("a") == b"1"                         # still usable after a timeout
    finally:
        ours.close()


def test_a_workers_view_is_prefixed_per_restart_attempt_as_in_pytorch(torch_server):
    dist, server = torch_server
    env = {"TORCHELASTIC_RESTART_COUNT": "2", "TORCHELASTIC_USE_AGENT_STORE": "True"}
    assert uses_agent_store(env) and not uses_agent_store({"TORCHELASTIC_USE_AGENT_STORE": "1"})
    store, client = attempt_store("127.0.0.1", server.port, 10, env)
    try:
        assert isinstance(store, PrefixStore)
        store.set("k", "v")
        assert dist.PrefixStore("/worker/attempt_2", server).get("k") == b"v"
    finally:
        client.close()


def test_something_that_is_not_a_store_is_named():
    import socket
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)

    def answer_garbage():
        conn, _ = listener.accept()
        conn.recv(64)
        conn.sendall(b"HTTP")
        conn.close()
    t = threading.Thread(target=answer_garbage, daemon=True)
    t.start()
    try:
        with pytest.raises(Exception, match="not a c10d TCPStore"):
            AgentStore("127.0.0.1", listener.getsockname()[1], timeout=5)
    finally:
        t.join(5)
        listener.close()

"""``distgrad.distributed``'s surface in one process: stores (against torch's HashStore),
the rendezvous' clash detection, a one-rank world, and argument errors of the same
classes as torch.distributed's (checked side by side where torch is installed)."""
import threading
import time
from datetime import timedelta

import numpy as np
import pytest

import distgrad
import distgrad.distributed as dist
from distgrad.distributed import process_group

pytestmark = pytest.mark.timeout(60)


def _outcome(fn):
    try:
        return ("ok", fn())
    except Exception as e:  # noqa: BLE001 - the class is what is compared
        for base in (TypeError, ValueError, RuntimeError):
            if isinstance(e, base):
                return ("error", base.__name__)
        return ("error", type(e).__name__)


def _store_script(store):
    store.set_timeout(timedelta(seconds=0.2))
    steps = [
        lambda: store.compare_set("k", "", "v"),
        lambda: store.compare_set("k2", "x", "v"),
        lambda: store.compare_set("k", "v", "w"),
        lambda: store.compare_set("k", "zz", "q"),
        lambda: store.get("k"),
        lambda: store.add("c", 3),
        lambda: store.add("c", -1),
        lambda: store.get("c"),
        lambda: store.add("k", 1),
        lambda: store.get("missing"),
        lambda: store.wait(["missing"], timedelta(seconds=0.1)),
        lambda: store.check(["k", "c"]),
        lambda: store.check(["k", "nope"]),
        lambda: store.delete_key("k"),
        lambda: store.delete_key("k"),
        lambda: (store.append("a", "x"), store.append("a", b"y"), store.get("a"))[-1],
        lambda: (store.multi_set(["m1", "m2"], ["1", b"2"]), store.multi_get(["m1", "m2"]))[-1],
        lambda: store.set("i", 5),
        lambda: store.num_keys(),
    ]
    return [_outcome(s) for s in steps]


def test_stores_behave_as_torchs_hash_store(tmp_path):
    ours = _store_script(dist.HashStore())
    # (torch's own FileStore differs from its HashStore: deleting a missing key is True,
    # num_keys counts one more; ours follows HashStore)
    assert _store_script(dist.FileStore(str(tmp_path / "store"), 1)) == ours
    server = dist.TCPStore("127.0.0.1", 0, is_master=True, timeout=timedelta(seconds=5))
    try:
        client = dist.TCPStore("127.0.0.1", server.port)
        assert _store_script(client) == ours
        prefixed = dist.PrefixStore("p", dist.TCPStore("127.0.0.1", server.port))
        prefixed.set("x", "1")
        assert client.get("p/x") == b"1" and prefixed.num_keys() == 1
    finally:
        server.close()
    assert ours[9] == ("error", "RuntimeError") and ours[8] == ("error", "ValueError")
    torch = pytest.importorskip("torch")
    import torch.distributed as tdist
    assert _store_script(tdist.HashStore()) == ours
    assert issubclass(dist.DistStoreError, RuntimeError) and torch is not None


def test_tcp_store_waits_without_polling_and_times_out_naming_the_key():
    server = dist.TCPStore("127.0.0.1", 0, is_master=True, timeout=2)
    try:
        client = dist.TCPStore("127.0.0.1", server.port, timeout=5)
        threading.Timer(0.1, lambda: server.set("late", b"here")).start()
        t0 = time.monotonic()
        assert client.get("late") == b"here"
        assert time.monotonic() - t0 < 2   # woken by the set, long before its timeout
        client.set_timeout(timedelta(seconds=0.3))
        with pytest.raises(dist.DistStoreError, match="'never'"):
            client.get("never")
        # a second master at the same address in this process shares the server
        twin = dist.TCPStore("127.0.0.1", 0, is_master=True, multi_tenant=True)
        again = dist.TCPStore("127.0.0.1", twin.port, is_master=True, multi_tenant=True)
        again.set("shared", "1")
        assert twin.get("shared") == b"1"
        again.close()
        twin.close()
    finally:
        server.close()


def test_master_waits_for_its_workers():
    with pytest.raises(dist.DistStoreError, match="1/2 clients"):
        dist.TCPStore("127.0.0.1", 0, world_size=2, is_master=True, timeout=0.3)


def _meet_all(claims, world_size):
    """Run the rendezvous for ``claims`` ([(rank, world_size)]) on threads; their outcomes."""
    store = dist.HashStore()
    out = [None] * len(claims)

    def run(i, rank, ws):
        try:
            out[i] = process_group._meet(store, rank, ws, f"tcp://127.0.0.1:{i + 1}", 5.0)
        except dist.DistError as e:
            out[i] = e
    threads = [threading.Thread(target=run, args=(i, r, ws)) for i, (r, ws) in enumerate(claims)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    return out


def test_rendezvous_tells_every_claimant_of_a_rank_clash_at_once():
    t0 = time.monotonic()
    out = _meet_all([(0, 2), (0, 2)], 2)
    assert time.monotonic() - t0 < 3
    assert all(isinstance(e, dist.DistError) and "rank 0 was claimed by 2 processes" in str(e)
               for e in out), out


def test_rendezvous_reports_different_world_sizes():
    out = _meet_all([(0, 2), (1, 3)], 2)
    assert all(isinstance(e, dist.DistError) and "world_size" in str(e) for e in out), out


def test_rendezvous_gives_everyone_the_table():
    out = _meet_all([(1, 3), (0, 3), (2, 3)], 3)
    assert out == [[b"tcp://127.0.0.1:2", b"tcp://127.0.0.1:1", b"tcp://127.0.0.1:3"]] * 3


@pytest.fixture
def alone():
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def test_one_rank_world(alone):
    assert dist.is_initialized() and dist.get_rank() == 0 and dist.get_world_size() == 1
    assert dist.get_backend() == "gloo" and dist.group.WORLD is not None
    with pytest.raises(ValueError, match="twice"):
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    x = distgrad.arange(6.).reshape(2, 3)
    dist.all_reduce(x.t(), op=dist.ReduceOp.AVG)
    assert x.tolist() == [[0, 1, 2], [3, 4, 5]]
    outs = [distgrad.zeros(2, 3)]
    w = dist.all_gather(outs, x, async_op=True)
    assert w.wait() and outs[0].tolist() == x.tolist() and w.result() == outs
    objs = [None]
    dist.all_gather_object(objs, {"a": (1, 2)})
    assert objs == [{"a": (1, 2)}]
    sub = dist.new_group([0])
    assert dist.get_rank(sub) == 0 and dist.get_process_group_ranks(sub) == [0]
    dist.barrier()
    dist.destroy_process_group()
    with pytest.raises(ValueError, match="Default process group has not been initialized"):
        dist.get_rank()


BAD_CALLS = {
    "not a tensor": lambda d, t: d.all_reduce([1, 2]),
    "list too long": lambda d, t: d.all_gather([t.ones(3), t.ones(3)], t.ones(3)),
    "wrong shape": lambda d, t: d.all_gather([t.ones(4)], t.ones(3)),
    "max of complex": lambda d, t: d.all_reduce(t.ones(3, dtype=t.complex64), op=d.ReduceOp.MAX),
    "band of floats": lambda d, t: d.all_reduce(t.ones(3), op=d.ReduceOp.BAND),
    "avg of ints": lambda d, t: d.all_reduce(t.ones(3, dtype=t.int64), op=d.ReduceOp.AVG),
    "bad root": lambda d, t: d.broadcast(t.ones(3), src=5),
    "send to self": lambda d, t: d.send(t.ones(2), dst=0),
    "gather list off root": lambda d, t: d.gather(t.ones(2), [t.ones(2)], dst=1),
    "into too small": lambda d, t: d.all_gather_into_tensor(t.ones(4), t.ones(3)),
}


@pytest.mark.parametrize("name", sorted(BAD_CALLS))
def test_bad_arguments_raise_torchs_exception_classes(alone, name):
    ours = _outcome(lambda: BAD_CALLS[name](dist, distgrad))
    assert ours[0] == "error", ours
    torch = pytest.importorskip("torch")
    import torch.distributed as tdist
    tdist.init_process_group("gloo", store=tdist.HashStore(), rank=0, world_size=1)
    try:
        theirs = _outcome(lambda: BAD_CALLS[name](tdist, torch))
    finally:
        tdist.destroy_process_group()
    if theirs[0] == "ok":
        pytest.skip(f"torch accepts it: {theirs}")
    assert ours == theirs


def test_names_of_the_api():
    assert repr(dist.ReduceOp.SUM) == "<RedOpType.SUM: 0>" and str(dist.ReduceOp.MAX) == \
        "RedOpType.MAX"
    assert dist.ReduceOp(dist.ReduceOp.MIN) == dist.ReduceOp.MIN
    assert dist.Backend("GLOO") == "gloo" and dist.is_gloo_available()
    assert not dist.is_nccl_available()
    with pytest.raises(RuntimeError, match="NCCL"):
        dist.init_process_group("nccl", store=dist.HashStore(), rank=0, world_size=1)
    with pytest.raises(ValueError, match="rank must be non-negative"):
        dist.init_process_group("gloo", store=dist.HashStore(), world_size=1)
    assert not dist.is_initialized()
    np.testing.assert_equal(dist.default_pg_timeout.total_seconds(), 1800)


def test_env_init_method_reads_master_addr_port_rank_and_world_size(monkeypatch):
    import socket
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    for var in ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "DISTGRAD_COORDINATOR"):
        monkeypatch.delenv(var, raising=False)
    with pytest.raises(ValueError, match="RANK expected"):
        dist.init_process_group("gloo")
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "1")
    with pytest.raises(ValueError, match="MASTER_ADDR"):
        dist.init_process_group("gloo", init_method="env://")
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(port))
    dist.init_process_group("gloo")
    try:
        assert dist.get_rank() == 0 and dist.get_world_size() == 1
        store = process_group.default_store()
        assert isinstance(store, dist.TCPStore) and store.port == port
    finally:
        dist.destroy_process_group()

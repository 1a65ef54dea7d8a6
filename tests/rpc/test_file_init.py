"""``init_method="file:///path"`` (PyTorch's file init): rank 0 writes where its rendezvous
runs into the file, the others wait for it there, and rank 0 removes it at shutdown. The
file hands the world a secret when nobody gave one; one file serves init_process_group
and init_rpc; a file an earlier run left behind is named."""
import os
import stat
import textwrap
import time

import msgpack
import pytest

from distgrad.distributed import rpc
from distgrad.rpc.credentials import SECRET_ENV
from distgrad.rpc.rendezvous_file import KEY, publish, read_published
from local.programs import run_programs

pytestmark = pytest.mark.timeout(120)

RANK = textwrap.dedent("""
    import sys
    import distgrad
    from distgrad.distributed import rpc
    rank, path = int(sys.argv[1]), sys.argv[2]
    options = rpc.TensorPipeRpcBackendOptions(init_method="file://" + path)
    rpc.init_rpc(f"worker{rank}", rank=rank, world_size=2, rpc_backend_options=options)
    if rank == 0:
        total = rpc.rpc_sync("worker1", distgrad.add, (distgrad.ones(2), distgrad.ones(2)))
        print("sum", total.tolist(), flush=True)
    rpc.shutdown()
""")


# init_process_group and init_rpc over one file, in the order given by argv[3].
BOTH = textwrap.dedent("""
    import sys
    import distgrad
    import distgrad.distributed as dist
    from distgrad.distributed import rpc
    rank, path, order = int(sys.argv[1]), sys.argv[2], sys.argv[3]
    url = "file://" + path
    def group():
        dist.init_process_group("gloo", init_method=url, rank=rank, world_size=2)
    def world():
        options = rpc.TensorPipeRpcBackendOptions(init_method=url)
        rpc.init_rpc(f"worker{rank}", rank=rank, world_size=2, rpc_backend_options=options)
    for step in (group, world) if order == "pg-first" else (world, group):
        step()
    t = distgrad.tensor([float(rank + 1)])
    dist.all_reduce(t)
    peer = rpc.rpc_sync(f"worker{1 - rank}", distgrad.mul, (t, distgrad.tensor([2.0])))
    print("result", t.item(), peer.item(), flush=True)
    rpc.shutdown()
    dist.destroy_process_group()
""")


def test_ranks_meet_through_a_file_whichever_starts_first(tmp_path, monkeypatch):
    monkeypatch.delenv(SECRET_ENV, raising=False)
    path = tmp_path / "rendezvous"
    # rank 1 starts first and waits for a file that does not exist yet
    results = run_programs([(RANK, 1, path), (RANK, 0, path)], stagger=0.5)
    for code, _, err in results:
        assert code == 0, err
        # the file handed the world a secret: nobody joined without one
        assert "without a secret" not in err, err
    assert "sum [2.0, 2.0]" in results[1][1]
    assert not path.exists()  # rank 0 removed it at shutdown


@pytest.mark.parametrize("order", ["pg-first", "rpc-first"])
def test_one_file_serves_a_process_group_and_an_rpc_world(tmp_path, monkeypatch, order):
    monkeypatch.delenv(SECRET_ENV, raising=False)
    path = tmp_path / "both"
    results = run_programs([(BOTH, 0, path, order), (BOTH, 1, path, order)])
    for code, out, err in results:
        assert code == 0, err
        assert "result 3.0 6.0" in out
    assert not path.exists()  # the last of its users removed it


def test_rank_0_writes_a_secret_only_into_a_private_file(tmp_path):
    private = tmp_path / "private"
    publish(str(private), "tcp://127.0.0.1:1", b"s3cret")
    assert stat.S_IMODE(os.stat(private).st_mode) == 0o600
    assert read_published(str(private), 1.0) == ("tcp://127.0.0.1:1", b"s3cret")
    shared = tmp_path / "shared"
    shared.touch(mode=0o644)
    os.chmod(shared, 0o644)
    from distgrad.rpc.rendezvous_file import keeps_secret
    assert keeps_secret(str(private)) and not keeps_secret(str(shared))


def _stale(path, pid):
    from distgrad.utils.host import boot_id
    record = {"address": "tcp://127.0.0.1:9", "pid": pid, "boot": boot_id()}
    path.write_bytes(msgpack.packb({KEY: msgpack.packb(record)}, use_bin_type=True))


def _dead_pid():
    import subprocess
    import sys
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def test_a_file_an_earlier_run_left_behind_is_named_on_every_rank(tmp_path):
    path = tmp_path / "stale"
    _stale(path, _dead_pid())
    options = rpc.TensorPipeRpcBackendOptions(init_method=f"file://{path}",
                                              rendezvous_timeout=5)
    with pytest.raises(rpc.RpcError, match=r"stale'? was left behind by an earlier run.*"
                                           r"remove it"):
        rpc.init_rpc("worker1", rank=1, world_size=2, rpc_backend_options=options)
    with pytest.raises(rpc.RpcError, match=r"holds an address already .*left behind by an "
                                           r"earlier run.*remove it"):
        rpc.init_rpc("worker0", rank=0, world_size=2, rpc_backend_options=options)
    assert path.exists()  # not ours to remove


def test_a_file_another_worlds_rank_0_uses_is_refused_to_rank_0(tmp_path):
    path = tmp_path / "busy"
    _stale(path, os.getppid())  # a live process of this host
    options = rpc.TensorPipeRpcBackendOptions(init_method=f"file://{path}",
                                              rendezvous_timeout=5)
    with pytest.raises(rpc.RpcError, match=r"in use by the rank 0 of another world"):
        rpc.init_rpc("worker0", rank=0, world_size=2, rpc_backend_options=options)


def test_a_rank_whose_rank_0_never_writes_the_file_is_told_which_file(tmp_path):
    options = rpc.TensorPipeRpcBackendOptions(init_method=f"file://{tmp_path}/never",
                                              rendezvous_timeout=0.5)
    t0 = time.monotonic()
    with pytest.raises(rpc.RpcTimeoutError, match=r"never'? within 0.5 s.*same init_method"):
        rpc.init_rpc("worker1", rank=1, world_size=2, rpc_backend_options=options)
    assert time.monotonic() - t0 < 5


def test_a_file_init_method_without_a_file_is_refused():
    with pytest.raises(ValueError, match="names no file"):
        rpc.init_rpc("worker0", rank=0, world_size=1,
                     rpc_backend_options=rpc.TensorPipeRpcBackendOptions(init_method="file://"))

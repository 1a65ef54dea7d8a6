"""Worlds that form without a launcher get a secret where someone can hand one (a spawn
parent, a torchrun agent), and a bare ``init_rpc`` world without one says so once, on
rank 0, where processes of other hosts could have joined it (not on loopback), or
refuses with ``DISTGRAD_REQUIRE_SECRET=1``."""
import subprocess
import sys
import textwrap

import pytest

from distgrad.distributed import rpc
from distgrad.rpc.credentials import REQUIRE_ENV, SECRET_ENV
from distgrad.utils.addresses import host_address, is_loopback
from distgrad.utils.ports import free_port
from local.programs import run_programs

pytestmark = pytest.mark.timeout(120)

# A world of two spawned ranks; each reports the secret it has and what it computed.
SPAWNED = textwrap.dedent("""
    import os, sys, warnings
    import distgrad
    import distgrad.multiprocessing as mp
    from distgrad.distributed import rpc

    def run(rank, port):
        warnings.simplefilter("error")  # a world without a secret would warn
        options = rpc.TensorPipeRpcBackendOptions(init_method=f"tcp://127.0.0.1:{port}")
        rpc.init_rpc(f"worker{rank}", rank=rank, world_size=2, rpc_backend_options=options)
        if rank == 0:
            total = rpc.rpc_sync("worker1", distgrad.add, (distgrad.ones(2), distgrad.ones(2)))
            print("sum", total.tolist(), flush=True)
        print("secret", rank, os.environ["DISTGRAD_WORLD_SECRET"], flush=True)
        rpc.shutdown()

    if __name__ == "__main__":
        assert "DISTGRAD_WORLD_SECRET" not in os.environ
        mp.spawn(run, args=(int(sys.argv[1]),), nprocs=2)
        print("parent", os.environ.get("DISTGRAD_WORLD_SECRET"), flush=True)
""")

# One rank of a world whose ranks are started by hand, without a secret.
BY_HAND = textwrap.dedent("""
    import sys
    from distgrad.distributed import rpc
    rank, port, host, size = int(sys.argv[1]), sys.argv[2], sys.argv[3], int(sys.argv[4])
    options = rpc.TensorPipeRpcBackendOptions(init_method=f"tcp://{host}:{port}")
    rpc.init_rpc(f"worker{rank}", rank=rank, world_size=size, rpc_backend_options=options)
    rpc.shutdown()
    print("done", flush=True)
""")


def test_spawned_ranks_share_a_secret_their_parent_made(tmp_path, monkeypatch):
    monkeypatch.delenv(SECRET_ENV, raising=False)
    program = tmp_path / "spawned.py"
    program.write_text(SPAWNED)
    done = subprocess.run([sys.executable, str(program), str(free_port())], timeout=90,
                          capture_output=True, text=True)
    out, err = done.stdout, done.stderr
    assert done.returncode == 0, err
    assert "sum [2.0, 2.0]" in out
    secrets = {line.split()[2] for line in out.splitlines() if line.startswith("secret ")}
    assert len(secrets) == 1 and len(secrets.pop()) == 64  # both ranks, the same one
    assert "parent None" in out  # the parent's own environment is left alone


def _outward_address():
    """An address of this host that other hosts could reach (skips where it has none)."""
    ip = host_address()
    if is_loopback(ip):
        pytest.skip("this host has no address but its loopback")
    return ip


def test_ranks_started_by_hand_on_loopback_without_a_secret_are_not_warned(monkeypatch):
    # nobody but this host's processes could have joined: nothing to say
    monkeypatch.delenv(SECRET_ENV, raising=False)
    monkeypatch.delenv(REQUIRE_ENV, raising=False)
    port = free_port()
    for code, out, err in run_programs([(BY_HAND, r, port, "127.0.0.1", 2) for r in range(2)]):
        assert code == 0, err
        assert "done" in out and "without a secret" not in err, err


def test_ranks_started_by_hand_without_a_secret_are_warned_once_by_rank_0(monkeypatch):
    monkeypatch.delenv(SECRET_ENV, raising=False)
    monkeypatch.delenv(REQUIRE_ENV, raising=False)
    ip, port = _outward_address(), free_port()
    results = run_programs([(BY_HAND, r, port, ip, 3) for r in range(3)], timeout=120)
    for code, out, err in results:
        assert code == 0, err
        assert "done" in out
    (_, _, err0), *others = results
    assert err0.count("formed a world of 3 processes without a secret") == 1, err0
    assert f"'worker0' (rank 0)" in err0 and f"tcp://{ip}:{port}" in err0
    assert SECRET_ENV in err0 and REQUIRE_ENV in err0
    assert all("without a secret" not in err for _, _, err in others)


def test_require_secret_refuses_a_world_without_one(monkeypatch):
    monkeypatch.delenv(SECRET_ENV, raising=False)
    monkeypatch.setenv(REQUIRE_ENV, "1")
    options = rpc.TensorPipeRpcBackendOptions(init_method=f"tcp://127.0.0.1:{free_port()}")
    with pytest.raises(rpc.RpcError, match=rf"'worker0' \(rank 0\) has no world secret and "
                                           rf"{REQUIRE_ENV} is set: give every process"):
        rpc.init_rpc("worker0", rank=0, world_size=1, rpc_backend_options=options)


def test_require_secret_is_satisfied_by_a_secret(monkeypatch):
    monkeypatch.setenv(REQUIRE_ENV, "1")
    options = rpc.TensorPipeRpcBackendOptions(init_method=f"tcp://127.0.0.1:{free_port()}",
                                              world_secret="ours")
    rpc.init_rpc("worker0", rank=0, world_size=1, rpc_backend_options=options)
    rpc.shutdown()

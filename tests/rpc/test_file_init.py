"""``init_method="file:///path"`` (PyTorch's file init): rank 0 writes where its rendezvous
runs into the file, the others wait for it there, and rank 0 removes it at shutdown."""
import textwrap
import time

import pytest

from distgrad.distributed import rpc
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


def test_ranks_meet_through_a_file_whichever_starts_first(tmp_path):
    path = tmp_path / "rendezvous"
    # rank 1 starts first and waits for a file that does not exist yet
    results = run_programs([(RANK, 1, path), (RANK, 0, path)], stagger=0.5)
    for code, _, err in results:
        assert code == 0, err
    assert "sum [2.0, 2.0]" in results[1][1]
    assert not path.exists()  # rank 0 removed it at shutdown


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

"""A process group over a simulated link (``pg_options.simulated_link``) pays its delay, as
an RPC world does: a DDP launch over a simulated link must not average its gradients
instantly while every other message waits."""
import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.timeout(120)

SCRIPT = textwrap.dedent("""
    import sys, time
    import distgrad, distgrad.distributed as dist
    import distgrad.multiprocessing as mp
    from distgrad.distributed.rpc import RpcBackendOptions
    from distgrad.utils.ports import free_port

    def rank_main(rank, port, link):
        options = RpcBackendOptions(simulated_link=link) if link else None
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                                world_size=2, pg_options=options)
        t = distgrad.ones(1 << 18)   # 1 MB: one message each way
        t0 = time.perf_counter()
        for _ in range(3):
            dist.all_reduce(t)
        took = time.perf_counter() - t0
        assert float(t[0]) == 8.0
        if rank == 0:
            print(took)
        dist.destroy_process_group()

    if __name__ == "__main__":
        mp.spawn(rank_main, args=(free_port(), sys.argv[1] if len(sys.argv) > 1 else None),
                 nprocs=2)
""")


def test_an_all_reduce_over_a_simulated_link_takes_its_delay(tmp_path):
    script = tmp_path / "pg_link.py"
    script.write_text(SCRIPT)
    done = subprocess.run([sys.executable, str(script), "300ms 10Gbit/s"], capture_output=True,
                          text=True, timeout=100)
    assert done.returncode == 0, done.stderr
    # a lower bound only (the machine may be slow, never faster than the link): the
    # peer sends its part of the k-th all_reduce once it has this rank's part of the
    # one before, so three in a row take two crossings of the link at least, whenever
    # the peer started (one alone could meet a part the peer sent before this rank began)
    assert float(done.stdout.split()[-1]) >= 0.6, done.stdout


def test_a_malformed_link_is_refused_by_name():
    from distgrad.distributed.rpc import RpcBackendOptions
    with pytest.raises(ValueError, match="simulated link"):
        RpcBackendOptions(simulated_link="fast")

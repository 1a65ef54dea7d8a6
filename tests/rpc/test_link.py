"""A simulated link holds messages as a network between hosts would (rpc/link.py)."""
import time

import numpy as np
import pytest

from distgrad.distributed import rpc
from distgrad.rpc.link import SimulatedLink, parse_link
from support import rpc_funcs as f

pytestmark = pytest.mark.timeout(60)


def test_links_parse_with_units_and_refuse_garbage():
    assert parse_link("200us 10Gbit/s") == pytest.approx((200e-6, 10e9 / 8))
    assert parse_link("2ms, 1Gbit") == pytest.approx((2e-3, 1e9 / 8))
    assert parse_link("0s 100MB/s") == pytest.approx((0.0, 100e6))
    for bad in ("", "fast", "2ms", "2 parsecs 1Gbit/s", "1ms 0Gbit/s", "1ms 5 furlongs/s"):
        with pytest.raises(ValueError, match="latency|link"):
            parse_link(bad)
    with pytest.raises(ValueError, match="simulated link"):
        rpc.RpcBackendOptions(simulated_link="soon")


def test_arrival_is_serialisation_on_the_senders_link_plus_latency():
    link = SimulatedLink(0.001, 1e6)  # 1 ms, 1 MB/s
    assert link.arrival(1, 1000, now=10.0) == pytest.approx(10.0 + 0.001 + 0.001)
    # the next message from the same sender waits for the link; another sender does not
    assert link.arrival(1, 1000, now=10.0) == pytest.approx(10.0 + 0.002 + 0.001)
    assert link.arrival(2, 1000, now=10.0) == pytest.approx(10.0 + 0.001 + 0.001)
    delivered = []
    link.hold(3.0, delivered.append, "b")
    link.hold(2.0, delivered.append, "a")
    link.release(2.5)
    assert delivered == ["a"] and link.next_due == 3.0
    link.release(3.0)
    assert delivered == ["a", "b"]


def test_a_world_over_a_slow_link_is_slower_by_what_the_link_costs(rpc_world):
    rpc_world(1, transport="tcp", simulated_link="20ms 80Mbit/s")  # 10 MB/s
    rpc.rpc_sync("worker1", f.add, (1, 2))
    t0 = time.monotonic()
    assert rpc.rpc_sync("worker1", f.add, (1, 2)) == 3
    small = time.monotonic() - t0
    assert small >= 0.040  # the request and the reply each wait out the latency
    a = np.ones(1 << 18, dtype=np.float32)  # 1 MiB: ~0.1 s each way on the link, no shm
    t0 = time.monotonic()
    assert rpc.rpc_sync("worker1", f.sum_array, (a,)) == a.size
    assert time.monotonic() - t0 >= 0.040 + 0.1
    assert rpc.rpc_sync("worker1", f.shm_stats)["peers"] == []  # the hosts are apart: no shm

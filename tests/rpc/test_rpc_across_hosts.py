"""RPC worlds across simulated hosts (network namespaces on a switch, see
``distgrad/testing/hosts.py``): every way of forming one works with what PyTorch needs
(MASTER_ADDR/MASTER_PORT), each process reached at its address toward the rendezvous."""
import pytest

from support import multihost

pytestmark = pytest.mark.timeout(90)

SECRET = {"DISTGRAD_WORLD_SECRET": "multihost-test-secret"}


def _run_world(hosts, fn, world_size, *args, placement=None, **kwargs):
    """Run ``fn(rank, world_size, *args)`` for every rank, rank r on host
    ``placement[r]`` (default: round robin); their results, by rank."""
    placement = placement or [r % len(hosts) for r in range(world_size)]
    procs = [hosts[placement[r]].spawn(fn, r, world_size, *args, **kwargs)
             for r in range(world_size)]
    return [p.result(60) for p in procs]


def _check_round(seen):
    assert seen["sync"] == 3 and seen["remote"] == [2.0, 2.0]
    assert seen["grad"] == [2.0, 2.0, 2.0] and seen["big_ok"]


@pytest.mark.parametrize("init", ["env", "tcp"])
def test_init_rpc_across_two_hosts_with_master_addr_and_port_only(simulated_hosts, monkeypatch,
                                                                  init):
    hosts = simulated_hosts(2, private_shm=True)
    for k, v in SECRET.items():
        monkeypatch.setenv(k, v)
    (seen, _) = _run_world(hosts, multihost.rpc_member, 2, "host0", 29400, init)
    _check_round(seen["w1"])
    assert seen["endpoints"] == [f"tcp://{hosts[0].address}:{seen['endpoints'][0].rsplit(':', 1)[1]}",
                                 f"tcp://{hosts[1].address}:{seen['endpoints'][1].rsplit(':', 1)[1]}"]
    assert seen["w1"]["peer_ns"] != seen["ns"]  # the peer really ran on the other host


def test_a_world_of_four_on_two_hosts_by_ipv6_address(simulated_hosts, monkeypatch):
    hosts = simulated_hosts(2, ipv6=True)
    for k, v in SECRET.items():
        monkeypatch.setenv(k, v)
    results = _run_world(hosts, multihost.rpc_member, 4, hosts[0].address6, 29401)
    seen = results[0]
    for peer in ("w1", "w2", "w3"):
        _check_round(seen[peer])
    assert all(ep.startswith("tcp://[fd00:") for ep in seen["endpoints"])


@pytest.mark.parametrize("rpc_first", [False, True])
def test_process_group_and_rpc_share_one_master_port_across_hosts(simulated_hosts, monkeypatch,
                                                                  rpc_first):
    hosts = simulated_hosts(2)
    for k, v in SECRET.items():
        monkeypatch.setenv(k, v)
    results = _run_world(hosts, multihost.pg_and_rpc_member, 3, "host0", 29402, rpc_first,
                         placement=[0, 1, 1])
    for rank, got in enumerate(results):
        assert got["sum"] == [6.0] * 4 and got["rpc"] == rank + 10


def test_the_rpc_world_fixture_puts_workers_on_simulated_hosts(rpc_world):
    from distgrad.distributed import rpc
    from distgrad.rpc import current_agent
    world = rpc_world(2, hosts=2)
    endpoints = current_agent().transport.endpoints
    assert [world.host_of(n).address for n in ("worker1", "worker2")] == \
        [ep.split("//")[1].rsplit(":", 1)[0] for ep in endpoints[1:]]
    assert rpc.rpc_sync("worker2", multihost.add, (2, 3)) == 5
    here = multihost.where()[1]
    assert len({here, *(rpc.rpc_sync(w, multihost.where)[1] for w in ("worker1", "worker2"))}) == 3


def test_bad_addresses_are_named_with_the_host_and_what_happened(simulated_hosts, monkeypatch):
    a, b = simulated_hosts(2)
    for k, v in SECRET.items():
        monkeypatch.setenv(k, v)
    refused = b.spawn(multihost.failing_member, 1, 2, "host0", 29410).result(60)
    assert "nothing listens at host0" in refused and "port 29410 (connection refused)" in refused
    unknown = b.spawn(multihost.failing_member, 1, 2, "nosuchhost", 29410).result(60)
    assert "'nosuchhost' does not resolve" in unknown
    no_nic = b.spawn(multihost.failing_member, 1, 2, "host0", 29410,
                     {"DISTGRAD_SOCKET_IFNAME": "eth9"}).result(60)
    assert "DISTGRAD_SOCKET_IFNAME='eth9'" in no_nic and "no interface 'eth9'" in no_nic \
        and "eth0" in no_nic
    a.drop_port(29411)  # a firewall on host0 that drops what comes for the rendezvous
    rank0 = a.spawn(multihost.failing_member, 0, 2, "host0", 29411)
    dropped = b.spawn(multihost.failing_member, 1, 2, "host0", 29411).result(60)
    assert "no answer from host0" in dropped and "a firewall drops" in dropped
    assert "missing ranks [1]" in rank0.result(60)


def test_hosts_that_disagree_on_the_world_size_are_told_so(simulated_hosts, monkeypatch):
    a, b = simulated_hosts(2)
    for k, v in SECRET.items():
        monkeypatch.setenv(k, v)
    rank0 = a.spawn(multihost.failing_member, 0, 2, "host0", 29412)
    other = b.spawn(multihost.failing_member, 1, 3, "host0", 29412, None, 10.0).result(60)
    assert "world_size 3 of 'w1' differs from the coordinator's 2" in other
    assert "missing ranks [1]" in rank0.result(60)


def test_a_host_that_vanishes_is_named_with_all_its_ranks(rpc_world):
    import time

    from distgrad.distributed import rpc
    from distgrad.rpc.errors import WorkerUnreachableError
    world = rpc_world(4, hosts=2, heartbeat_timeout=2.0, leak_check=False)
    lost = world.hosts[1]
    assert [world.host_of(f"worker{r}") for r in (2, 4)] == [lost, lost]
    slow = [rpc.rpc_async(w, multihost.sleep_then, (30,)) for w in ("worker2", "worker4")]
    world.lose_host(lost)
    t0 = time.monotonic()
    for fut in slow:
        with pytest.raises(WorkerUnreachableError) as err:
            fut.wait()
        text = str(err.value)
        assert f"on host {lost.address} is unreachable" in text
        assert f"nor from any rank of its host {lost.address} (ranks 2, 4)" in text
    assert time.monotonic() - t0 < 2.0 + 2.0  # the heartbeat bound, and a margin for load
    assert rpc.rpc_sync("worker3", multihost.add, (1, 1)) == 2  # the other host goes on


@pytest.mark.parametrize("outage", [1.0, 2.0])
def test_a_link_that_drops_and_comes_back_within_the_bound_loses_nothing(rpc_world, outage):
    import time

    from distgrad.distributed import rpc
    world = rpc_world(2, hosts=2, heartbeat_timeout=3.0)
    h = world.hosts[1]
    before = [rpc.rpc_async("worker2", multihost.add, (i, 1)) for i in range(50)]
    h.link_down()
    during = [rpc.rpc_async("worker2", multihost.add, (i, 2)) for i in range(50)]
    time.sleep(outage)  # the outage itself (TCP resends what was in flight once it ends)
    h.link_up()
    after = [rpc.rpc_async("worker2", multihost.add, (i, 3)) for i in range(50)]
    assert [f.wait() for f in before] == [i + 1 for i in range(50)]
    assert [f.wait() for f in during] == [i + 2 for i in range(50)]
    assert [f.wait() for f in after] == [i + 3 for i in range(50)]


def test_the_secret_set_on_every_host_admits_them_and_a_wrong_one_is_refused(simulated_hosts,
                                                                              monkeypatch):
    a, b = simulated_hosts(2)
    monkeypatch.setenv("DISTGRAD_WORLD_SECRET", "the-right-one")
    rank0 = a.spawn(multihost.failing_member, 0, 2, "host0", 29413, None, 10.0)
    wrong = b.spawn(multihost.failing_member, 1, 2, "host0", 29413,
                    {"DISTGRAD_WORLD_SECRET": "another-one"}).result(60)
    assert "'w1' (rank 1) has a wrong world secret" in wrong
    right = b.spawn(multihost.failing_member, 1, 2, "host0", 29413).result(60)
    assert right == "joined" and rank0.result(60) == "joined"

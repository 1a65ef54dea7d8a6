"""A process group talks only to its members, each as its own rank: an outsider that
reads the store gets no connection, a member cannot speak as another rank, and an entry
slipped into the store without the world secret is refused, named."""
import datetime
import textwrap

import msgpack
import pytest
import zmq

import distgrad.distributed as dist
from distgrad.distributed.members import entry
from distgrad.distributed.messages import ABORT
from distgrad.rpc import wire
from distgrad.rpc.credentials import REQUIRE_ENV, SECRET_ENV
from distgrad.utils.addresses import host_address, is_loopback
from distgrad.utils.ports import free_port
from local.programs import run_programs
from support.outsider import REFUSED, outsider_events
from support.pg_world import World

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def world():
    w = World(3, options={"cases": ["support.pg_trust_cases"]})
    try:
        yield w
    finally:
        w.close()


def _addresses(world, rank):
    """Where rank ``rank`` listens, as anyone who reaches the store can read it."""
    address, _, _ = msgpack.unpackb(world.store.get(f"distgrad_pg/default/member/{rank}"))
    return [a for a in address.split()[:2]]


def test_an_outsider_that_reads_the_store_gets_no_connection(world):
    gid = 0  # any: the message must not get as far as its group
    forged = [[wire.pack_header(wire.Kind.CALL, 1, src, [ABORT, gid, 1, 0, "outsider"]),
               msgpack.packb(None)] for src in (0, 1)]
    public, secret = zmq.curve_keypair()
    for rank in (0, 1):
        for address in _addresses(world, rank):
            for options in ({}, {"plain_username": b"0", "plain_password": b"guessed"},
                            {"curve_serverkey": public, "curve_publickey": public,
                             "curve_secretkey": secret}):
                answers, events = outsider_events(address, forged, **options)
                assert answers == 0 and events & REFUSED, (rank, address, options, events)
    assert world.run("sum_of_ranks") == [6.0, 6.0, 6.0]


def test_a_member_cannot_speak_as_another_rank(world):
    before = world.run("dropped", ranks=[1])[0]
    # rank 2, with its own credential, tells rank 1 that rank 0 aborted the default group
    [answer] = world.run("abort_claiming", 1, 0, ranks=[2])
    assert answer[0] == wire.Kind.ERROR
    assert "claims to come from rank 0" in answer[1] and "admitted as rank 2" in answer[1]
    assert world.run("dropped", ranks=[1])[0] == before + 1
    assert world.run("sum_of_ranks") == [6.0, 6.0, 6.0]  # the group is not broken


def test_an_entry_without_the_world_secret_is_refused_by_name(tmp_path, monkeypatch):
    monkeypatch.setenv(SECRET_ENV, "the-worlds")
    path = str(tmp_path / "store")
    store = dist.FileStore(path, 2)
    # a process without the secret got to the store first, as rank 1
    forged = dist.PrefixStore("distgrad_pg/default", store)
    forged.add("rank/1", 1)
    forged.set("member/1", entry(1, 2, "tcp://127.0.0.1:9", "ab" * 32, b"guessed"))
    with pytest.raises(dist.DistError, match=r"entry for rank 1 of the process group does "
                                             rf"not prove the world secret.*{SECRET_ENV}"):
        dist.init_process_group("gloo", store=store, rank=0, world_size=2,
                                timeout=datetime.timedelta(seconds=10))
    assert not dist.is_initialized()
    store.close()


BY_HAND = textwrap.dedent("""
    import sys
    import distgrad
    import distgrad.distributed as dist
    rank, url = int(sys.argv[1]), sys.argv[2]
    dist.init_process_group("gloo", init_method=url, rank=rank, world_size=2)
    t = distgrad.tensor([float(rank + 1)])
    dist.all_reduce(t)
    print("sum", t.item(), flush=True)
    dist.destroy_process_group()
""")


def test_ranks_started_by_hand_without_a_secret_work_and_rank_0_warns(tmp_path, monkeypatch):
    monkeypatch.delenv(SECRET_ENV, raising=False)
    ip = host_address()
    if is_loopback(ip):
        pytest.skip("this host has no address but its loopback")
    url = f"tcp://{ip}:{free_port()}"   # a store other hosts could reach
    (code0, out0, err0), (code1, out1, err1) = run_programs([(BY_HAND, r, url) for r in range(2)])
    assert code0 == 0 and code1 == 0, err0 + err1
    assert "sum 3.0" in out0 and "sum 3.0" in out1
    assert err0.count("process group rank 0 formed a world of 2 processes without a secret") \
        == 1, err0
    assert SECRET_ENV in err0 and "without a secret" not in err1, err1
    # on loopback only this host's processes could have joined; a private file needs no
    # secret (only its owner writes the entries): nothing to say
    for url in (f"tcp://127.0.0.1:{free_port()}", f"file://{tmp_path}/store"):
        for code, out, err in run_programs([(BY_HAND, r, url) for r in range(2)]):
            assert code == 0, err
            assert "sum 3.0" in out and "without a secret" not in err, err


def test_require_secret_refuses_a_process_group_without_one(monkeypatch):
    monkeypatch.delenv(SECRET_ENV, raising=False)
    monkeypatch.setenv(REQUIRE_ENV, "1")
    with pytest.raises(dist.DistError, match=rf"process group rank 0 has no world secret and "
                                             rf"{REQUIRE_ENV} is set"):
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=2,
                                timeout=datetime.timedelta(seconds=10))
    assert not dist.is_initialized()

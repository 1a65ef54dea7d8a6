"""The rendezvous of torchrun's agents (``distributed/elastic/rendezvous``) in one process:
the shared state and its atomic updates, heartbeats, the store's handshake with and
without the world secret, and whole rounds of two agents on this machine (static and
c10d): forming, ranks, the workers' master address, a failure ending the round for both,
a newcomer, a disagreement."""
import threading
import time

import pytest

from distgrad.distributed import HashStore
from distgrad.distributed.elastic.rendezvous import (RendezvousClosedError,
                                                     RendezvousConnectionError, RendezvousError,
                                                     RendezvousStateError,
                                                     RendezvousTimeoutError)
from distgrad.distributed.elastic.rendezvous.handler import Rendezvous, Settings
from distgrad.distributed.elastic.rendezvous.rendezvous_store import (curve_keys, open_store,
                                                                      parse_endpoint)
from distgrad.distributed.elastic.rendezvous.state import (Heartbeat, Liveness, Node,
                                                           SharedState, State)
from distgrad.distributed.elastic.workers import Failure, assign_ranks
from distgrad.utils.ports import free_port

pytestmark = pytest.mark.timeout(60)


def test_ranks_follow_the_nodes_before_and_roles_count_their_own():
    nodes = [("trainer", 2), ("reader", 1), ("trainer", 3)]
    assert assign_ranks(nodes, 0) == (0, 6, 0, 5)
    assert assign_ranks(nodes, 1) == (2, 6, 0, 1)
    assert assign_ranks(nodes, 2) == (3, 6, 2, 5)


@pytest.mark.parametrize("text,expected", [
    ("host0:29400", ("host0", 29400)), ("host0", ("host0", 7)), ("", ("localhost", 7)),
    ("[fd00::1]:5", ("fd00::1", 5)), ("[fd00::1]", ("fd00::1", 7)),
    ("10.0.0.1:0", ("10.0.0.1", 0))])
def test_an_endpoint_reads_as_torchrun_reads_it(text, expected):
    assert parse_endpoint(text, 7) == expected


@pytest.mark.parametrize("text,words", [("host:port", "must be an integer"),
                                        ("host:70000", "must be an integer"),
                                        ("bad host:1", "dot-separated list of labels")])
def test_a_bad_endpoint_is_named(text, words):
    with pytest.raises(ValueError, match=words):
        parse_endpoint(text, 7)


def _node(i, rank=-1, nproc=1):
    return Node(f"10.0.0.{i}_1_0", f"host{i} (10.0.0.{i})", f"10.0.0.{i}", 100 + i, rank,
                "default", nproc)


def test_the_state_travels_whole_and_garbage_is_refused_by_name():
    state = State({"backend": "c10d", "nnodes": "1:2", "max_restarts": 0})
    state.nodes, state.waiting, state.round = [_node(1)], [_node(2)], 3
    again = State.unpack(state.pack())
    assert again.ids() == [_node(1).id] and again.ids("waiting") == [_node(2).id]
    assert again.round == 3 and again.config == state.config
    for garbage in (b"\x93\x01\x02\x03", b"not msgpack \xc1", b"\x00"):
        with pytest.raises(RendezvousStateError, match="another program"):
            State.unpack(garbage)


def test_concurrent_updates_of_the_shared_state_lose_nothing():
    shared = SharedState(HashStore(), {"backend": "c10d"})

    def join(i):
        for k in range(20):
            shared.update(lambda s: s.nodes.append(_node(i * 100 + k)) or True)

    threads = [threading.Thread(target=join, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert len(shared.read()[0].nodes) == 80


def test_a_node_whose_heartbeat_stands_still_is_lost_and_a_beating_one_is_not():
    store = HashStore()
    beating = Heartbeat(store, _node(1).id, 0.05)
    store.add(f"heartbeat/{_node(2).id}", 1)
    liveness = Liveness(store, 0.4)
    try:
        deadline = time.monotonic() + 10
        lost = []
        while not lost and time.monotonic() < deadline:
            lost = liveness.stale([_node(1), _node(2)])
            time.sleep(0.02)
        assert lost == [_node(2)]
    finally:
        assert beating.stop(5)


# ---------------------------------------------------------------------- the store
def test_the_store_answers_only_agents_with_its_secret():
    port = free_port()
    server, served = open_store("127.0.0.1", port, True, secret="s1", timeout=5,
                                read_timeout=5)
    try:
        assert served
        client, served = open_store("127.0.0.1", port, False, secret="s1", timeout=5,
                                    read_timeout=5)
        client.set("k", b"v")
        assert server.get("k") == b"v" and not served
        client.close()
        for secret, words in (("s2", "refused this agent's world secret"),
                              (None, "this host has no world secret and the store's host a")):
            with pytest.raises(RendezvousConnectionError, match=words):
                open_store("127.0.0.1", port, False, secret=secret, timeout=5, read_timeout=5)
    finally:
        server.close()
    assert curve_keys("s1") == curve_keys(b"s1") != curve_keys("s2") and curve_keys(None) is None


def test_where_nothing_answers_the_error_says_so_within_the_timeout():
    port = free_port()
    started = time.monotonic()
    with pytest.raises(RendezvousConnectionError,
                       match=f"nothing answers at the rendezvous store 127.0.0.1:{port} after "
                             r"0.5 s \(Connection refused\)"):
        open_store("127.0.0.1", port, False, secret=None, timeout=0.5, read_timeout=5)
    assert time.monotonic() - started < 5


# ---------------------------------------------------------------------- whole rounds
def _settings(backend, port, node_rank=-1, nnodes=(2, 2), restarts=1, **conf):
    conf = {k: str(v) for k, v in conf.items()}
    conf.setdefault("keep_alive_interval", "0.2")
    conf.setdefault("timeout" if backend == "static" else "join_timeout", "10")
    conf.setdefault("close_timeout", "2")
    return Settings(backend, nnodes[0], nnodes[1], node_rank, "job", ("127.0.0.1", port),
                    restarts, conf, master_addr="127.0.0.1" if backend == "static" else None)


def _together(*calls):
    """Run each call in a thread of its own; their results (or exceptions), in order."""
    results = [None] * len(calls)

    def run(i, call):
        try:
            results[i] = call()
        except Exception as e:  # noqa: BLE001 - handed to the test
            results[i] = e
    threads = [threading.Thread(target=run, args=(i, c)) for i, c in enumerate(calls)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    return results


def _agents(settings, nproc=(1, 1), secret="s"):
    """Agents of ``settings`` (one per entry), the store's first."""
    return [Rendezvous(s, n, "default", secret, local_addr="127.0.0.1")
            for s, n in zip(settings, nproc)]


def test_a_static_round_forms_ranks_by_node_rank_and_ends_for_both_on_a_failure():
    port = free_port()
    a, b = _agents([_settings("static", port, 0), _settings("static", port, 1)], nproc=(2, 1))
    try:
        ra, rb = _together(a.next_rendezvous, b.next_rendezvous)
        assert (ra.group_rank, rb.group_rank, ra.restarts) == (0, 1, 0)
        assert [n.nproc for n in ra.nodes] == [2, 1] and rb.first_rank() == 2
        ma, mb = _together(ra.master, rb.master)
        assert ma == mb and ma[0] == "127.0.0.1" and ma[1] > 0
        assert ra.check() is None and rb.check() is None
        failure = Failure(2, 0, 99, 3, None, "host1", "")
        ended = rb.fail([failure])
        assert (ended.why, ended.final, ended.failures[0].rank) == ("failed", False, 2)
        seen = ra.check()
        assert seen.why == "failed" and seen.failures[0].exitcode == 3 and not seen.final
        ra2, rb2 = _together(a.next_rendezvous, b.next_rendezvous)
        assert ra2.restarts == rb2.restarts == 1 and ra2.round == 1
        final = ra2.fail([Failure(0, 0, 98, 1, None, "host0", "")])
        assert final.final and rb2.check().final      # no restart left: closed for both
        with pytest.raises(RendezvousClosedError, match="rank 0 .* on host0 exited with 1"):
            b.next_rendezvous()
    finally:
        _together(b.shutdown, a.shutdown)


def test_nodes_that_disagree_on_nnodes_both_fail_naming_it():
    port = free_port()
    a = _agents([_settings("static", port, 0)])[0]
    b = _agents([_settings("static", port, 1, nnodes=(3, 3))])[0]
    try:
        ea, eb = _together(a.next_rendezvous, b.next_rendezvous)
        for e in (ea, eb):
            assert isinstance(e, RendezvousError), e
            assert "--nnodes 3" in str(e) and "--nnodes 2" in str(e)
    finally:
        _together(b.shutdown, a.shutdown)


def test_a_second_agent_with_a_node_rank_taken_is_refused():
    port = free_port()
    a, b, c = _agents([_settings("static", port, r, nnodes=(3, 3), timeout=3)
                       for r in (0, 1, 1)], nproc=(1, 1, 1))
    try:
        b.shared.update(b._join)      # b is in the forming round as node rank 1
        with pytest.raises(RendezvousError, match="node rank 1 is claimed by two agents: "
                                                  "localhost .* and localhost"):
            c.next_rendezvous()
    finally:
        _together(c.shutdown, b.shutdown, a.shutdown)


def test_an_elastic_round_completes_after_the_last_call_and_a_newcomer_restarts_it():
    port = free_port()
    conf = dict(last_call_timeout=1.0)
    a, b = _agents([_settings("c10d", port, nnodes=(1, 3), is_host=1, **conf),
                    _settings("c10d", port, nnodes=(1, 3), is_host=0, **conf)])
    try:
        ra = a.next_rendezvous()                  # alone: MIN is 1, the last call passes
        assert (ra.group_rank, len(ra.nodes)) == (0, 1)
        rb, (ended, ra2) = _together(b.next_rendezvous,
                                     lambda: (_until_ended(ra), a.next_rendezvous()))
        assert ended.why == "membership" and not ended.final
        assert len(rb.nodes) == len(ra2.nodes) == 2 and rb.restarts == 0
        assert ra2.master() == rb.master()
    finally:
        _together(b.shutdown, a.shutdown)


def test_an_elastic_world_below_its_minimum_times_out_naming_the_nodes_it_has():
    port = free_port()
    a = _agents([_settings("c10d", port, nnodes=(2, 2), is_host=1, join_timeout=0.5)])[0]
    try:
        with pytest.raises(RendezvousTimeoutError,
                           match=r"did not reach --nnodes 2:2 within join_timeout=0.5 s: 1 "):
            a.next_rendezvous()
    finally:
        a.shutdown()


def _until_ended(rnd, timeout=20):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        ended = rnd.check()
        if ended is not None:
            return ended
        time.sleep(0.02)
    raise AssertionError("the round did not end")

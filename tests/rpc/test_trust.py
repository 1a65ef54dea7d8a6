"""Trust across hosts: who may talk to a world, what a source may claim, and that every
CALL is answered, also when its sender is refused."""
import threading

import msgpack
import pytest
import zmq

from distgrad.distributed import rpc
from distgrad.rpc import current_agent, wire
from distgrad.rpc.credentials import SECRET_ENV
from distgrad.rpc.errors import RpcError
from distgrad.rpc.rendezvous import RendezvousError, RendezvousServer, join
from distgrad.testing.world import World
from support import forger
from support.outsider import REFUSED, outsider_events
from support import rpc_funcs as f

pytestmark = pytest.mark.timeout(90)


def _raw(endpoint, **options):
    ctx = zmq.Context()
    s = ctx.socket(zmq.DEALER)
    s.linger = 0
    s.sndtimeo = 5000  # a test must fail, not hang, if the worker went away
    for k, v in options.items():
        setattr(s, k, v)
    s.connect(endpoint)
    return ctx, s


def _member(rank):
    """A socket to ``rank`` that speaks the protocol by hand as this process (rank 0), with
    its credential: what a member that forges its messages would use."""
    transport = current_agent().transport
    return _raw(transport.endpoints[rank], **transport.client_options(rank))


def _call(target, args, kwargs=None, remote=None):
    return msgpack.packb([target, args, kwargs or {}, remote])


def _answer(s, timeout=5.0):
    assert s.poll(int(timeout * 1000)), "no answer"
    frames = s.recv_multipart()
    kind, mid, _, _, _ = wire.unpack_header(frames[0])
    body = msgpack.unpackb(frames[1]) if len(frames) > 1 else None
    return kind, mid, body


@pytest.mark.parametrize("src", [10**9, -1, 2])
def test_a_call_from_a_source_outside_the_world_is_answered(rpc_world, src):
    rpc_world(1)
    ctx, s = _member(1)
    try:
        for kind in (wire.Kind.CALL, wire.Kind.SYSTEM):
            s.send_multipart([wire.pack_header(kind, 41, src), _call(f.add.__module__ + ":add",
                                                                      [1, 2])])
            answer, mid, body = _answer(s)
            assert (answer, mid) == (wire.Kind.ERROR, 41)
            assert body[0] == "ProtocolError" and f"source rank {src} is not in the world" \
                in body[2]
    finally:
        ctx.destroy(linger=0)
    assert rpc.rpc_sync("worker1", f.add, (2, 2)) == 4


# ---------------------------------------------------------------------- the attacks of issue 22
def _attacks(src):
    """The messages of issue 22, each claiming rank ``src``."""
    add = f"{f.add.__module__}:add"
    return [
        [wire.pack_header(wire.Kind.CALL, 1, src), _call("@barrier", [])],
        [wire.pack_header(wire.Kind.SYSTEM, 2, src), _call("@barrier", [])],
        [wire.pack_header(wire.Kind.CALL, 3, src, {"autograd": [[src, 123], [], []]}),
         _call(add, [1, 2])],
        [wire.pack_header(wire.Kind.SYSTEM, 0, src, {"@bk": [["rref.add", [[[src, 9], [src, 9]]]]]}),
         _call("@bk", [])],
    ]


@pytest.mark.parametrize("transport", ["ipc", "tcp"])
def test_an_outsider_gets_no_connection_to_any_member(rpc_world, transport):
    rpc_world(2, transport=transport)
    agent = current_agent()
    before = rpc.rpc_sync("worker1", f.agent_stats)
    public, secret = zmq.curve_keypair()
    for rank in (0, 1):
        for options in ({}, {"identity": b"0"},
                        {"plain_username": b"0", "plain_password": b"guessed"},
                        {"plain_username": b"1", "plain_password": b"guessed"},
                        {"curve_serverkey": public, "curve_publickey": public,
                         "curve_secretkey": secret}):
            answers, events = outsider_events(agent.transport.endpoints[rank],
                                               _attacks(0) + _attacks(2), **options)
            assert answers == 0 and events & REFUSED, (rank, options, events)
    # nothing changed for the members: rank 0 did not arrive at the shutdown barrier (where
    # the workers wait: its arrival would end the world), no entry was made, calls work
    assert 0 in agent.barrier.missing()   # (the workers arrive when they will)
    after = rpc.rpc_sync("worker1", f.agent_stats)
    assert after["rrefs"] == 0 and after.get("dropped", 0) == before.get("dropped", 0)
    assert [rpc.rpc_async(w, f.add, (i, 1)).wait(10) for i in range(20)
            for w in ("worker1", "worker2")][-1] == 20


def test_a_member_cannot_speak_as_another_rank(rpc_world):
    rpc_world(2)
    agent = current_agent()
    forge = f"{forger.__name__}:send_forged"
    # worker2 claims to be rank 0 at rank 0's barrier (CALL and SYSTEM alike), where the
    # workers wait: rank 0's arrival would end the world
    for kind in (wire.Kind.CALL, wire.Kind.SYSTEM):
        answer = rpc.rpc_sync("worker2", forge, (0, kind, 0, "@barrier"))
        assert answer is not None and answer[:2] == [wire.Kind.ERROR, 77]
        assert answer[2][0] == "ProtocolError"
        assert "claims to come from rank 0" in answer[2][2] and "admitted as rank 2" in answer[2][2]
    assert 0 in agent.barrier.missing()   # (the workers arrive when they will)
    # worker2 claims to be rank 0 at worker1: with autograd contexts, and RRef forks
    for frames in _attacks(0):
        kind, mid, src, extra, _ = wire.unpack_header(frames[0])
        answer = rpc.rpc_sync("worker2", forge, (1, kind, 0, "@bk" if mid == 0 else
                                                  f"{f.add.__module__}:add", [1, 2], extra, None,
                                                  mid or 0, True, 1.0 if mid == 0 else 3.0))
        if mid == 0:   # a one-way message: refused without an answer
            assert answer is None
        else:
            assert answer[0] == wire.Kind.ERROR and "admitted as rank 2" in answer[2][2]
    stats = rpc.rpc_sync("worker1", f.agent_stats)
    assert stats["rrefs"] == 0 and stats["dropped"] >= 4
    assert rpc.rpc_sync("worker1", f.add, (2, 3)) == 5


def test_a_member_cannot_take_over_another_members_connection_at_a_third(rpc_world):
    # worker2 learns the routing identity of worker1's socket to worker3 (here: handed to
    # it; no member sees another's identity to a third) and connects to worker3 presenting
    # it while worker1's calls are in flight: its connection is never read, nothing of
    # worker1's is lost (with ROUTER_HANDOVER it took the identity over and calls were lost)
    rpc_world(3)
    identity, took, results, received = rpc.rpc_sync(
        "worker1", forger.calls_beside_a_taker, (3, "worker3", "worker2"), timeout=60)
    assert identity.startswith("1:") and took
    assert results == [2 * i for i in range(400)]
    assert received == []   # no reply meant for worker1, and its forged call never served
    assert rpc.rpc_sync("worker3", f.agent_stats).get("handler_errors", 0) == 0


@pytest.mark.parametrize("identity", [b"1:" + b"ab" * 12, b"1:" + b"0" * 24, b"1", b"0:x",
                                      b"2", b"2:short", b"2:" + b"AB" * 12, b"worker2"])
def test_a_connection_whose_identity_is_not_its_ranks_is_refused(rpc_world, identity):
    # another rank's identity prefix whatever the tag, or any identity not of the form of
    # worker2's own sockets: each of its calls is refused, on the connection it came on
    rpc_world(3)
    answer = rpc.rpc_sync("worker2", forger.send_forged,
                          (3, wire.Kind.CALL, 2, f"{f.add.__module__}:add", [1, 2], None, identity))
    assert answer is not None and answer[:2] == [wire.Kind.ERROR, 77], answer
    assert answer[2][0] == "ProtocolError"
    assert "presents the routing identity" in answer[2][2] and \
        "not of the form of rank 2's sockets" in answer[2][2]
    # a connection without an identity (the router numbers it) is served on it
    answer = rpc.rpc_sync("worker2", forger.send_forged,
                          (3, wire.Kind.CALL, 2, f"{f.add.__module__}:add", [1, 2]))
    assert answer[:2] == [wire.Kind.REPLY, 77] and answer[2] == 3
    assert rpc.rpc_sync("worker3", f.add, (2, 3)) == 5


def test_without_authentication_a_world_still_works(rpc_world):
    rpc_world(1, authenticate=False)
    assert current_agent().transport.credential.mechanism == "none"
    assert rpc.rpc_sync("worker1", f.add, (2, 3)) == 5


# ---------------------------------------------------------------------- the world's secret
def _rendezvous(secret, world_size=2):
    ctx = zmq.Context()
    srv = RendezvousServer(ctx, "tcp://127.0.0.1:0", secret=secret)
    srv.start(world_size, 10.0)
    return ctx, srv


def _join(ctx, srv, name, rank, secret, world_size=2):
    return join(ctx, srv.address, name, rank, world_size, "tcp://127.0.0.1:1", 5.0,
                auth=["plain", "ab" * 32], secret=secret)


def test_a_missing_or_wrong_secret_is_refused_naming_the_process(caplog):
    ctx, srv = _rendezvous(b"right")
    try:
        with pytest.raises(RendezvousError, match=r"'intruder' \(rank 1\) has no world secret.*"
                                                  + SECRET_ENV):
            _join(ctx, srv, "intruder", 1, None)
        with pytest.raises(RendezvousError, match=r"'guesser' \(rank 1\) has a wrong world secret"):
            _join(ctx, srv, "guesser", 1, b"wrong")
        assert "refused 'guesser' (rank 1)" in caplog.text   # rank 0 says who, too
        # the world forms with the members that hold it; their table is proven
        done = []
        t = threading.Thread(target=lambda: done.append(_join(ctx, srv, "w0", 0, b"right")))
        t.start()
        table = _join(ctx, srv, "w1", 1, b"right")
        t.join(10)
        assert [row[:2] for row in table] == [["w0", 0], ["w1", 1]] and done == [table]
    finally:
        srv.stop()
        ctx.destroy(linger=0)


def test_an_answer_without_proof_of_the_secret_is_not_believed():
    ctx = zmq.Context()
    try:   # someone else answers at the rendezvous address, with a table of its own
        impostor = ctx.socket(zmq.ROUTER)
        address = f"tcp://127.0.0.1:{impostor.bind_to_random_port('tcp://127.0.0.1')}"
        joined = []
        t = threading.Thread(target=lambda: joined.append(pytest.raises(
            RendezvousError, join, ctx, address, "w0", 0, 1, "tcp://127.0.0.1:1", 5.0,
            auth=["plain", "ab" * 32], secret=b"ours")))
        t.start()
        assert impostor.poll(5000)
        ident, _ = impostor.recv_multipart()
        impostor.send_multipart([ident, msgpack.packb(
            {"ok": True, "workers": [["w0", 0, "tcp://127.0.0.1:2", ["none", None]]]})])
        t.join(10)
        assert "without proof that it holds the world secret" in str(joined[0].value)
    finally:
        ctx.destroy(linger=0)


def test_a_worker_with_a_wrong_secret_says_so_and_exits():
    world = World(1, worker_env={SECRET_ENV: "not-the-worlds"}, rendezvous_timeout=2.0)
    with pytest.raises(RpcError, match=r"missing ranks \[1\]"):
        world.start()
    assert "could not join the world: rendezvous failed for 'worker1' (rank 1): 'worker1' " \
        f"(rank 1) has a wrong world secret: its {SECRET_ENV} differs" in world.log_text("worker1")

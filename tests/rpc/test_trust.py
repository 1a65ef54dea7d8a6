"""Trust across hosts: who may talk to a world, what a source may claim, and that every
CALL is answered, also when its sender is refused."""
import msgpack
import pytest
import zmq

from distgrad.distributed import rpc
from distgrad.rpc import current_agent, wire
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
    ctx, s = _raw(current_agent().transport.endpoints[1])
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

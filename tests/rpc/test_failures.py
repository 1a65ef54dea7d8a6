"""Failures: dead workers, garbage on the wire, CURVE, and the interceptor seam."""
import os
import signal
import subprocess
import sys
import threading
import time

import msgpack
import pytest
import zmq

from distgrad.distributed import rpc
from distgrad.rpc import wire
from distgrad.rpc import current_agent
from support import rpc_funcs as f

pytestmark = pytest.mark.timeout(60)


def test_sigkilled_worker_fails_pending_calls_naming_it(rpc_world):
    world = rpc_world(2, transport="tcp")
    slow = rpc.rpc_async("worker1", f.sleep_and_return, (30.0,))
    box = []
    t = threading.Thread(target=lambda: box.append(_catch(
        lambda: rpc.rpc_sync("worker1", f.sleep_and_return, (30.0,)))))
    t.start()
    time.sleep(0.3)
    t0 = time.monotonic()
    world.kill("worker1")
    with pytest.raises(rpc.WorkerUnreachableError, match="worker1") as e:
        slow.wait()
    assert isinstance(e.value, RuntimeError)
    t.join(10)
    assert isinstance(box[0], rpc.WorkerUnreachableError) and "worker1" in str(box[0])
    assert time.monotonic() - t0 < 5.0
    with pytest.raises(RuntimeError, match="worker1"):  # new calls fail at once
        rpc.rpc_sync("worker1", f.add, (1, 2))
    assert rpc.rpc_sync("worker2", f.add, (1, 2)) == 3  # the others still serve


def _catch(fn):
    try:
        return fn()
    except Exception as e:  # noqa: BLE001
        return e


def _raw_dealer(ctx, endpoint, **curve):
    s = ctx.socket(zmq.DEALER)
    s.linger = 0
    for k, v in curve.items():
        setattr(s, k, v)
    s.connect(endpoint)
    return s


GOOD_BODY = msgpack.packb(["support.rpc_funcs:add", [1, 2], {}, None])


@pytest.mark.parametrize("transport", ["ipc", "tcp"])
def test_garbage_is_dropped_counted_and_serving_goes_on(rpc_world, transport):
    rpc_world(1, transport=transport)
    endpoint = current_agent().transport.endpoints[1]
    ctx = zmq.Context()
    try:  # as this process (rank 0): with its credential
        s = _raw_dealer(ctx, endpoint, **current_agent().transport.client_options(1))
        bad = [
            [b"garbage"],                                                  # truncated
            [b"\xc1", b"x"],                                               # not msgpack
            [msgpack.packb([99, 1, 1, 0, None]), GOOD_BODY],               # unknown version
            [msgpack.packb([1, 77, 1, 0, None]), GOOD_BODY],               # unknown kind
            [b"\x91" + b"\x00" * 70000, GOOD_BODY],                        # oversized header
            [wire.pack_header(wire.Kind.RELEASE, 0, 1, None, ["x"]), b""],  # forged one-way
        ]
        for frames in bad:
            s.send_multipart(frames)
        # a well-formed header with a broken body still gets an error reply
        s.send_multipart([wire.pack_header(wire.Kind.CALL, 11, 0), b"\x93\xc1"])
        assert s.poll(5000)
        header, body = s.recv_multipart()[:2]
        kind, mid, _, _, _ = wire.unpack_header(header)
        assert (kind, mid) == (wire.Kind.ERROR, 11)
        assert msgpack.unpackb(body)[0] == "ProtocolError"
        s.send_multipart([wire.pack_header(wire.Kind.CALL, 12, 0), GOOD_BODY])
        assert s.poll(5000)
        header, body = s.recv_multipart()[:2]
        assert wire.unpack_header(header)[:2] == (wire.Kind.REPLY, 12) and msgpack.unpackb(body) == 3
        s.send_multipart([wire.pack_header(wire.Kind.CALL, 13, 0),
                          msgpack.packb(["os:system", ["true"], {}, None])])
        assert s.poll(5000)
        header, body = s.recv_multipart()[:2]
        assert msgpack.unpackb(body)[0] == "RefusedCallError"
        s.close()
    finally:
        ctx.destroy(linger=0)
    assert rpc.rpc_sync("worker1", f.agent_stats)["dropped"] == len(bad)
    assert rpc.rpc_sync("worker1", f.add, (2, 2)) == 4


def test_curve_world_refuses_processes_without_the_key(rpc_world):
    public, secret = rpc.generate_curve_keypair()
    rpc_world(1, transport="tcp", curve_public_key=public, curve_secret_key=secret)
    assert rpc.rpc_sync("worker1", f.add, (1, 2)) == 3
    endpoint = current_agent().transport.endpoints[1]
    other_public, other_secret = zmq.curve_keypair()
    ctx = zmq.Context()
    try:
        plain = _raw_dealer(ctx, endpoint)
        stranger = _raw_dealer(ctx, endpoint, curve_serverkey=public, curve_publickey=other_public,
                               curve_secretkey=other_secret)
        for s in (plain, stranger):
            s.send_multipart([wire.pack_header(wire.Kind.CALL, 1, 0), GOOD_BODY])
        assert not plain.poll(1000) and not stranger.poll(200)
    finally:
        ctx.destroy(linger=0)
    assert rpc.rpc_sync("worker1", f.add, (3, 4)) == 7


def test_interceptor_sees_messages_and_scopes_handlers(rpc_world):
    rpc_world(2)
    rpc.rpc_sync("worker1", f.install_toy_interceptor)
    f.install_toy_interceptor()
    try:
        assert rpc.rpc_sync("worker1", f.scope_tag) == "request-from-worker0"
        assert rpc.rpc_async("worker1", f.add, (1, 2)).wait() == 3
        # a nested call made by the handler runs inside the scope on worker1
        assert rpc.rpc_sync("worker1", f.nested_call, ("worker0", f.scope_tag)) == "request-from-worker1"
        events = f.toy_events()
        assert ["send", "request", "worker1"] in events
        assert ["recv", "response", "worker1", "response-from-worker1"] in events
        remote_events = rpc.rpc_sync("worker1", f.toy_events)
        assert ["recv", "request", "worker0", "request-from-worker0"] in remote_events
    finally:
        f.remove_toy_interceptor()
        rpc.rpc_sync("worker1", f.remove_toy_interceptor)


def test_env_rendezvous_and_console_worker(tmp_path, monkeypatch):
    import tempfile
    d = tempfile.mkdtemp(prefix="dgenv-", dir="/tmp")
    coord = f"ipc://{d}/rdv.sock"
    exe = os.path.join(os.path.dirname(sys.executable), "distgrad")
    cmd = [exe] if os.path.exists(exe) else [sys.executable, "-m", "distgrad.cli"]
    env = dict(os.environ, RANK="1", WORLD_SIZE="2", DISTGRAD_COORDINATOR=coord,
               WORKER_NAME="envworker", DISTGRAD_PDEATHSIG="1", DISTGRAD_ALLOWED_MODULES="support",
               PYTHONPATH=os.pathsep.join(p or os.getcwd() for p in sys.path))
    log = open(tmp_path / "w.log", "wb")
    p = subprocess.Popen(cmd + ["worker"], env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        monkeypatch.setenv("DISTGRAD_COORDINATOR", coord)
        monkeypatch.setenv("RANK", "0")
        monkeypatch.setenv("WORLD_SIZE", "2")
        rpc.init_rpc("driver")
        try:
            assert rpc.rpc_sync("envworker", f.add, (5, 6)) == 11
        finally:
            rpc.shutdown()
        assert p.wait(10) == 0, (tmp_path / "w.log").read_text()
    finally:
        if p.poll() is None:
            p.send_signal(signal.SIGKILL)
        p.wait(10)
        log.close()
        import shutil
        shutil.rmtree(d, ignore_errors=True)


def test_world_close_reaps_every_worker_even_after_a_failure():
    from distgrad.testing.world import World
    w = World(2, transport="tcp").start()
    procs = list(w.procs.values())
    w.procs["worker2"].kill()  # one dies abruptly; closing must still reap all
    w.close()
    assert all(p.poll() is not None for p in procs)
    assert not os.path.exists(w.dir)

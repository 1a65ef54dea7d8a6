"""One address, one server: a process group's store and the RPC rendezvous share
MASTER_ADDR/MASTER_PORT in either order (as PyTorch's multi-tenant TCPStore lets them)."""
import os
import socket
import sys
import textwrap
import threading
import time
from pathlib import Path

import msgpack
import pytest
import zmq

from distgrad.distributed import TCPStore
from distgrad.distributed.errors import DistNetworkError
from distgrad.rpc.rendezvous import RendezvousError, RendezvousServer, join
from distgrad.utils.ports import free_port
from support.sessions import run_in_session

pytestmark = pytest.mark.timeout(120)

ROOT = Path(__file__).resolve().parents[2]


def _register(address, name, rank, world_size=2):
    ctx = zmq.Context()
    try:
        return join(ctx, address, name, rank, world_size, "tcp://127.0.0.1:1", 10)
    finally:
        ctx.destroy(linger=0)


def _world_of_two(address):
    results = []
    t = threading.Thread(target=lambda: results.append(_register(address, "a", 0)))
    t.start()
    table = _register(address, "b", 1)
    t.join(10)
    assert results == [table] and [row[0] for row in table] == ["a", "b"]


def _port_is_free(port):
    """Whether a listener could take ``port`` again (connections the server closed may
    linger in TIME_WAIT on it: a listener with SO_REUSEADDR binds beside those)."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


@pytest.mark.parametrize("store_first", [True, False])
def test_a_store_and_a_rendezvous_share_one_address_in_either_order(store_first):
    port = free_port()
    address = f"tcp://localhost:{port}"              # as MASTER_ADDR=localhost spells it
    if store_first:
        store = TCPStore("127.0.0.1", port, is_master=True, wait_for_workers=False,
                         multi_tenant=True)
        server = RendezvousServer(None, address)
    else:
        server = RendezvousServer(None, address)
        store = TCPStore("127.0.0.1", port, is_master=True, wait_for_workers=False,
                         multi_tenant=True)
    try:
        server.start(2, 10)
        client = TCPStore("127.0.0.1", port, is_master=False)
        client.set("k", "v")
        _world_of_two(server.address)
        assert store.get("k") == b"v"
        server.stop()
        assert client.add("n", 2) == 2                # the store outlives the rendezvous
        client.close()
    finally:
        server.stop()
        store.close()
    assert _port_is_free(port)                        # the last user closed the socket


def test_requests_that_come_before_their_server_wait_for_it():
    """A rank may reach init_process_group (or init_rpc) before rank 0 does, when rank 0's
    other half already serves the address: its first request waits for the server."""
    port = free_port()
    server = RendezvousServer(None, f"tcp://127.0.0.1:{port}")
    clients = []
    early = threading.Thread(target=lambda: clients.append(
        TCPStore("127.0.0.1", port, is_master=False, timeout=20)))
    early.start()
    store = None
    try:
        time.sleep(0.3)  # the client's hello is at the point now, with no store to answer it
        assert not clients
        store = TCPStore("127.0.0.1", port, is_master=True, wait_for_workers=False,
                         multi_tenant=True)
        early.join(20)
        assert clients and clients[0].add("n", 1) == 1
        clients[0].close()
    finally:
        early.join(20)
        server.stop()
        if store is not None:
            store.close()
    store = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    tables = []
    try:
        address = f"tcp://127.0.0.1:{store.port}"
        joiner = threading.Thread(target=lambda: tables.append(_register(address, "b", 1)))
        joiner.start()
        time.sleep(0.3)  # a registration, and no rendezvous yet
        server = RendezvousServer(None, address)
        server.start(2, 10)
        tables.append(_register(address, "a", 0))
        joiner.join(10)
        assert len(tables) == 2 and tables[0] == tables[1]
    finally:
        server.stop()
        store.close()


def test_what_cannot_share_an_address_is_refused_by_name():
    server = RendezvousServer(None, "tcp://127.0.0.1:0")
    try:
        port = int(server.address.rsplit(":", 1)[1])
        with pytest.raises(RendezvousError, match="already serves an RPC rendezvous"):
            RendezvousServer(None, server.address)
        store = TCPStore("127.0.0.1", port, is_master=True, wait_for_workers=False)
        try:
            with pytest.raises(DistNetworkError, match="already serves a store"):
                TCPStore("127.0.0.1", port, is_master=True, wait_for_workers=False)
        finally:
            store.close()
        public, secret = zmq.curve_keypair()
        with pytest.raises(RendezvousError, match="CURVE"):
            RendezvousServer(None, server.address, (public, secret))
    finally:
        server.stop()


def test_store_requests_and_registrations_are_told_apart_and_garbage_is_answered():
    store = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    server = RendezvousServer(None, f"tcp://127.0.0.1:{store.port}")
    ctx = zmq.Context()
    raw = ctx.socket(zmq.DEALER)
    try:
        raw.connect(server.address)
        raw.send(msgpack.packb([7, "nope", []]))          # an array: the store answers
        assert raw.poll(5000) and b"malformed store request" in raw.recv()
        server.start(2, 10)
        raw.send(msgpack.packb({"name": 3}))               # a map: the rendezvous answers
        assert raw.poll(5000) and b"malformed registration" in raw.recv()
    finally:
        raw.close(linger=0)
        ctx.destroy(linger=0)
        server.stop()
        store.close()


_PROGRAM = textwrap.dedent("""
    import os, sys
    import torch
    import torch.distributed as dist
    import torch.distributed.rpc as rpc
    import torch.multiprocessing as mp

    def double(x):
        return x * 2

    def run(rank, world_size, order):
        os.environ["MASTER_ADDR"] = "localhost"
        if order == "pg-first":
            dist.init_process_group("gloo", rank=rank, world_size=world_size)
            rpc.init_rpc(f"w{rank}", rank=rank, world_size=world_size)
        else:
            rpc.init_rpc(f"w{rank}", rank=rank, world_size=world_size)
            dist.init_process_group("gloo", rank=rank, world_size=world_size)
        t = torch.tensor([float(rank + 1)])
        dist.all_reduce(t)
        y = rpc.rpc_sync(f"w{(rank + 1) % world_size}", double, args=(t,))
        # one write of the line and its newline (print writes them apart, and unbuffered
        # the three processes sharing the pipe can interleave them)
        sys.stdout.write(f"RESULT {rank} {t.item()} {y.item()}\\n")
        sys.stdout.flush()
        rpc.shutdown()
        dist.destroy_process_group()

    if __name__ == "__main__":
        mp.spawn(run, args=(3, sys.argv[1]), nprocs=3)
""")


@pytest.mark.parametrize("order", ["pg-first", "rpc-first"])
def test_init_process_group_and_init_rpc_on_one_master_port(tmp_path, order):
    """Both orders on distgrad. PyTorch runs the same program (checked by hand); in the
    suite, the batch parameter-server example compares the first order with it."""
    program = tmp_path / "prog.py"
    program.write_text(_PROGRAM)
    env = dict(os.environ, PYTHONPATH=str(ROOT), MASTER_PORT=str(free_port()),
               PYTHONWARNINGS="ignore")
    env.pop("DISTGRAD_AS_TORCH", None)
    code, out, err = run_in_session([sys.executable, "-m", "distgrad.compat.as_torch",
                                      str(program), order], env, tmp_path)
    assert code == 0, err[-3000:]
    assert sorted(line for line in out.splitlines() if line.startswith("RESULT")) == \
        [f"RESULT {r} 6.0 12.0" for r in range(3)]

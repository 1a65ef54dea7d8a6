"""Programs that run as one process of a world on a simulated host (``Host.spawn``): each
sets the environment a user would (MASTER_ADDR/MASTER_PORT, RANK...), forms the world the
way the program says, does a little of everything across hosts, and returns what it saw
(JSON) for the test to check."""
import os
import socket

import numpy as np

import distgrad as torch
import distgrad.distributed as dist
import distgrad.distributed.autograd as dist_autograd
import distgrad.distributed.rpc as rpc


def add(a, b):
    return a + b


def where():
    """(this process's host, its network namespace)."""
    return [socket.gethostname(), os.stat("/proc/self/ns/net").st_ino]


def _environ(rank, world_size, master, port, extra):
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world_size), MASTER_ADDR=master,
                      MASTER_PORT=str(port), **(extra or {}))


def _rpc_round(peer):
    """rpc_sync, remote, a distributed backward and a 4 MB tensor, with ``peer``."""
    out = {"sync": rpc.rpc_sync(peer, add, (1, 2))}
    rref = rpc.remote(peer, add, (torch.ones(2), 1))
    out["remote"] = rref.to_here().tolist()
    x = torch.ones(3, requires_grad=True)
    with dist_autograd.context() as cid:
        y = rpc.rpc_sync(peer, torch.mul, (x, 2.0))
        dist_autograd.backward(cid, [y.sum()])
        out["grad"] = dist_autograd.get_gradients(cid)[x].tolist()
    big = torch.arange(1 << 20, dtype=torch.float32)
    back = rpc.rpc_sync(peer, add, (big, 1.0))
    out["big_ok"] = bool(np.array_equal(back.numpy(), big.numpy() + 1))
    out["peer_ns"] = rpc.rpc_sync(peer, where)[1]
    return out


def rpc_member(rank, world_size, master, port, init="env", extra_env=None):
    """One process of an ``init_rpc`` world (``init``: "env" or "tcp"); rank 0 works with
    every other rank and returns what it saw, with every member's endpoint."""
    _environ(rank, world_size, master, port, extra_env)
    options = rpc.TensorPipeRpcBackendOptions(
        init_method="env://" if init == "env" else f"tcp://{master}:{port}")
    rpc.init_rpc(f"w{rank}", rank=rank, world_size=world_size, rpc_backend_options=options)
    try:
        if rank != 0:
            return {}
        from distgrad.rpc import current_agent
        seen = {"endpoints": list(current_agent().transport.endpoints)}
        for peer in range(1, world_size):
            seen[f"w{peer}"] = _rpc_round(f"w{peer}")
        seen["ns"] = where()[1]
        return seen
    finally:
        rpc.shutdown()


def pg_and_rpc_member(rank, world_size, master, port, rpc_first=False):
    """``init_process_group`` and ``init_rpc`` on one MASTER_ADDR/MASTER_PORT, in either
    order: an all_reduce and an RPC across hosts."""
    _environ(rank, world_size, master, port, None)
    steps = [lambda: dist.init_process_group("gloo"),
             lambda: rpc.init_rpc(f"w{rank}", rank=rank, world_size=world_size)]
    for step in (reversed(steps) if rpc_first else steps):
        step()
    try:
        t = torch.tensor([float(rank + 1)] * 4)
        dist.all_reduce(t)
        peer = f"w{(rank + 1) % world_size}"
        return {"sum": t.tolist(), "rpc": rpc.rpc_sync(peer, add, (rank, 10))}
    finally:
        rpc.shutdown()
        dist.destroy_process_group()


def failing_member(rank, world_size, master, port, extra_env=None, timeout=3.0):
    """A member that should not be able to join: the error it gets, as text."""
    _environ(rank, world_size, master, port, extra_env)
    try:
        rpc.init_rpc(f"w{rank}", rank=rank, world_size=world_size,
                     rpc_backend_options=rpc.TensorPipeRpcBackendOptions(
                         rendezvous_timeout=timeout))
    except Exception as e:  # noqa: BLE001 - the error is the result
        return f"{type(e).__name__}: {e}"
    rpc.shutdown(graceful=False)
    return "joined"


def sleep_then(seconds):
    import time
    time.sleep(seconds)
    return seconds


def pause(seconds):
    import time
    time.sleep(seconds)


def offloaded_step(endpoint):
    """One training step's gradients with activations in the remote store at ``endpoint``,
    against the same step without offloading; and what the store held meanwhile."""
    from distgrad.offload import OffloadPolicy, save_on_remote
    from distgrad.offload.store import StoreClient
    torch.manual_seed(0)
    w = torch.randn(64, 64, requires_grad=True)
    x = torch.randn(32, 64)
    ((x @ w).tanh() @ w).relu().sum().backward()
    expected = w.grad.numpy().copy()
    w.grad = None
    client = StoreClient(endpoint, timeout=20.0)
    try:
        with save_on_remote(client, policy=OffloadPolicy(min_bytes=0)) as hooks:
            loss = ((x @ w).tanh() @ w).relu().sum()
            hooks.flush()
            held = client.stats()["client_blobs"]
        loss.backward()
        return {"equal": bool(np.array_equal(w.grad.numpy(), expected)), "held": held}
    finally:
        client.close()

"""A model split across two processes, trained with distributed autograd.

Stage one lives on ``worker1`` as a RemoteModule; stage two and the loss live
here (``trainer``). Each step runs forward through both, a distributed backward
(gradients cross back to worker1), and a DistributedOptimizer step that updates
both stages where they live. Run it as it is:

    python scripts/example_distributed.py
"""
import os
import socket

import distgrad
import distgrad.multiprocessing as mp
from distgrad import nn
from distgrad.distributed import autograd as dist_autograd
from distgrad.distributed import rpc
from distgrad.distributed.nn import RemoteModule
from distgrad.distributed.optim import DistributedOptimizer


def make_stage(width):
    """Built on the worker (by reference: this module is the one that calls init_rpc)."""
    return nn.Sequential(nn.Linear(width, width), nn.Tanh())


def run(rank, world_size, port):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    name = "trainer" if rank == 0 else f"worker{rank}"
    rpc.init_rpc(name, rank=rank, world_size=world_size)
    if rank == 0:
        distgrad.manual_seed(0)
        stage1 = RemoteModule("worker1", make_stage, args=(16,))      # lives on worker1
        stage2 = make_stage(16)                                       # lives here
        params = stage1.remote_parameters() + [rpc.RRef(p) for p in stage2.parameters()]
        opt = DistributedOptimizer(distgrad.optim.SGD, params, lr=0.05)
        x, target = distgrad.randn(32, 16), distgrad.zeros(32, 16)
        for step in range(5):
            with dist_autograd.context() as cid:
                loss = ((stage2(stage1(x)) - target) ** 2).mean()
                dist_autograd.backward(cid, [loss])
                opt.step(cid)
            print(f"step {step}: loss {loss.item():.4f}")
    rpc.shutdown()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


if __name__ == "__main__":
    mp.spawn(run, args=(2, int(os.environ.get("MASTER_PORT") or free_port())), nprocs=2)

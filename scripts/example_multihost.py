"""One process of a world that spans hosts, formed the way PyTorch's are: from RANK,
WORLD_SIZE, MASTER_ADDR and MASTER_PORT in the environment (and DISTGRAD_WORLD_SECRET,
the same on every host). RPC and a process group share the one port; rank 0 trains a
two-stage model whose second stage runs on rank 1, while all ranks average a value with
all_reduce.

    # on each host (host0 runs rank 0 and serves the rendezvous at MASTER_ADDR)
    MASTER_ADDR=host0 MASTER_PORT=29500 WORLD_SIZE=2 RANK=<0|1> \\
        DISTGRAD_WORLD_SECRET=<the same secret> python scripts/example_multihost.py

With no environment it runs both ranks itself, on this machine's loopback.
"""
import os
import socket
import subprocess
import sys

import distgrad as torch
import distgrad.distributed as dist
import distgrad.distributed.autograd as dist_autograd
import distgrad.distributed.rpc as rpc
from distgrad.distributed.optim import DistributedOptimizer


def make_stage():
    torch.manual_seed(1)
    return torch.nn.Linear(8, 1)


def parameter_rrefs(module_rref):
    """RRefs of the parameters of the module ``module_rref`` holds (run on its owner)."""
    return [rpc.RRef(p) for p in module_rref.local_value().parameters()]


def main():
    rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dist.init_process_group("gloo")        # env://: MASTER_ADDR/MASTER_PORT, as PyTorch
    rpc.init_rpc(f"worker{rank}", rank=rank, world_size=world_size)
    mean = torch.tensor([float(rank)])
    dist.all_reduce(mean)
    if rank == 0:
        torch.manual_seed(0)
        first = torch.nn.Linear(4, 8)
        second = rpc.remote("worker1", make_stage)
        params = [rpc.RRef(p) for p in first.parameters()]
        params += rpc.rpc_sync("worker1", parameter_rrefs, (second,))
        opt = DistributedOptimizer(torch.optim.SGD, params, lr=0.05)
        x, y = torch.randn(64, 4), torch.randn(64, 1)
        for step in range(20):
            with dist_autograd.context() as cid:
                out = second.rpc_sync().forward(first(x).tanh())
                loss = ((out - y) ** 2).mean()
                dist_autograd.backward(cid, [loss])
                opt.step(cid)
            if step in (0, 19):
                print(f"step {step}: loss {loss.item():.4f}")
        print(f"rank 0 on {socket.gethostname()}: all_reduce {mean.item():g}, "
              f"stage two on worker1")
    rpc.shutdown()
    dist.destroy_process_group()


def run_both_here():
    """Both ranks on this machine (what the guide does on two simulated hosts)."""
    from distgrad.utils.ports import free_port
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()),
               WORLD_SIZE="2", DISTGRAD_WORLD_SECRET="example-multihost")
    procs = [subprocess.Popen([sys.executable, __file__], env=dict(env, RANK=str(r)))
             for r in (1, 0)]
    codes = [p.wait(120) for p in procs]
    sys.exit(max(codes))


if __name__ == "__main__":
    if "RANK" in os.environ:
        main()
    else:
        run_both_here()

"""Train an MLP with DistributedDataParallel on 2 local ranks.

Each rank (a process started with ``distgrad.multiprocessing.spawn``) joins the process
group, wraps the same MLP in ``DistributedDataParallel`` and trains on its shard of the
data (``DistributedSampler``); gradients are averaged across the ranks during backward,
so both replicas stay identical. Rank 0 prints the loss.

    python scripts/example_ddp.py [--steps 60] [--world-size 2]
"""
import argparse
import os
import socket
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import numpy as np  # noqa: E402

import distgrad  # noqa: E402
import distgrad.distributed as dist  # noqa: E402
import distgrad.multiprocessing as mp  # noqa: E402
from distgrad import nn  # noqa: E402
from distgrad.nn.parallel import DistributedDataParallel as DDP  # noqa: E402
from distgrad.utils.data import DataLoader, DistributedSampler, TensorDataset  # noqa: E402


def dataset(n=512):
    """A fixed regression task: y = sin(x W) with a little noise."""
    g = np.random.default_rng(0)
    x = g.standard_normal((n, 8)).astype(np.float32)
    w = g.standard_normal((8, 2)).astype(np.float32)
    y = np.sin(x @ w) + 0.01 * g.standard_normal((n, 2)).astype(np.float32)
    return TensorDataset(distgrad.tensor(x), distgrad.tensor(y))


def train(rank, world_size, port, steps):
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world_size)
    distgrad.manual_seed(rank)  # replicas start different: DDP broadcasts rank 0's weights
    model = DDP(nn.Sequential(nn.Linear(8, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(),
                              nn.Linear(64, 2)))
    opt = distgrad.optim.Adam(model.parameters(), lr=3e-3)
    data = dataset()
    sampler = DistributedSampler(data, num_replicas=world_size, rank=rank, seed=0)
    loader = DataLoader(data, batch_size=32, sampler=sampler)
    step, epoch = 0, 0
    while step < steps:
        sampler.set_epoch(epoch)
        for x, y in loader:
            opt.zero_grad()
            loss = nn.functional.mse_loss(model(x), y)
            loss.backward()  # the all-reduces overlap the rest of backward
            opt.step()
            step += 1
            if rank == 0 and step % 10 == 0:
                print(f"step {step:4d}  loss {loss.item():.4f}", flush=True)
            if step == steps:
                break
        epoch += 1
    # the replicas are identical: compare a checksum of the weights across ranks
    sums = [None] * world_size
    dist.all_gather_object(sums, float(sum(p.detach().sum().item() for p in model.parameters())))
    if rank == 0:
        print(f"weights checksum per rank: {sums}")
        assert len(set(sums)) == 1
    dist.destroy_process_group()


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--world-size", type=int, default=2)
    args = ap.parse_args()
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]  # a free port for rank 0's store
    s.close()
    mp.spawn(train, args=(args.world_size, port, args.steps), nprocs=args.world_size)


if __name__ == "__main__":
    main()

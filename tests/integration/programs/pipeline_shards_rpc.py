"""Pipeline parallelism over RPC: a CNN cut into two shards that live on two workers, fed
in micro-batches so that the shards work on different micro-batches at once.

Written the way PyTorch's RPC pipeline example is: the master builds each shard where it
will run with ``rpc.remote(worker, ShardClass, args=...)``; for each micro-batch
(``split``) it wraps the input in an ``RRef``, asks shard one for an ``RRef`` of its
output (``rpc.remote`` of a method on the shard's value) and hands that RRef to shard
two with ``rpc_async``, so activations go from worker to worker without passing through
the master (``to_here()`` on arrival); the outputs are joined with
``torch.cat(torch.futures.wait_all(...))``. Shards guard their forward with a lock (RPC
threads may call at once). Training runs in ``dist_autograd.context()`` with
``dist_autograd.backward`` and a ``DistributedOptimizer`` over ``RRef``s of both shards'
parameters. The shards are convolution blocks with ``BatchNorm2d``, in-place ``ReLU``,
a bottleneck with a 1x1-conv shortcut, ``MaxPool2d`` and ``AdaptiveAvgPool2d``; weights
and data come from seeded NumPy generators so every library gets the same numbers.
MASTER_ADDR/MASTER_PORT come from the environment. Plain PyTorch.
"""
import json
import os
import threading

import numpy as np
import torch
import torch.distributed.autograd as dist_autograd
import torch.distributed.rpc as rpc
import torch.multiprocessing as mp
from torch import nn, optim
from torch.distributed.optim import DistributedOptimizer

from owner_calls import async_on_owner, parameter_rrefs, remote_on_owner

CLASSES, SIDE, BATCH, MICRO = 6, 12, 8, 4


def seeded_init(module, seed):
    rng = np.random.default_rng(seed)
    with torch.no_grad():
        for m in module.modules():
            if isinstance(m, (nn.Conv2d, nn.Linear)):
                fan_in = m.weight[0].numel()
                m.weight.copy_(torch.from_numpy(rng.normal(
                    0, (2.0 / fan_in) ** 0.5, tuple(m.weight.shape)).astype(np.float32)))
                if m.bias is not None:
                    m.bias.zero_()
            elif isinstance(m, nn.BatchNorm2d):
                nn.init.ones_(m.weight)
                nn.init.zeros_(m.bias)


class Bottleneck(nn.Module):
    """1x1 squeeze, 3x3, 1x1 expand, plus a 1x1-conv shortcut when the shape changes."""

    def __init__(self, into, inner, out, stride=1):
        super().__init__()
        self.path = nn.Sequential(
            nn.Conv2d(into, inner, 1, bias=False), nn.BatchNorm2d(inner), nn.ReLU(inplace=True),
            nn.Conv2d(inner, inner, 3, stride=stride, padding=1, bias=False),
            nn.BatchNorm2d(inner), nn.ReLU(inplace=True),
            nn.Conv2d(inner, out, 1, bias=False), nn.BatchNorm2d(out))
        self.shortcut = None
        if stride != 1 or into != out:
            self.shortcut = nn.Sequential(nn.Conv2d(into, out, 1, stride=stride, bias=False),
                                          nn.BatchNorm2d(out))
        self.act = nn.ReLU(inplace=True)

    def forward(self, x):
        out = self.path(x)
        out += x if self.shortcut is None else self.shortcut(x)
        return self.act(out)


class Shard(nn.Module):
    def __init__(self):
        super().__init__()
        self.lock = threading.Lock()

    def forward(self, x_rref):
        x = x_rref.to_here()
        with self.lock:
            return self.layers(x)

    def parameter_rrefs(self):
        return parameter_rrefs(self)


class FrontShard(Shard):
    def __init__(self):
        super().__init__()
        self.layers = nn.Sequential(
            nn.Conv2d(3, 8, 3, padding=1, bias=False), nn.BatchNorm2d(8), nn.ReLU(inplace=True),
            nn.MaxPool2d(kernel_size=2),
            Bottleneck(8, 4, 16), Bottleneck(16, 4, 16))
        seeded_init(self, 1)


class BackShard(Shard):
    def __init__(self):
        super().__init__()
        self.layers = nn.Sequential(Bottleneck(16, 8, 24, stride=2),
                                    nn.AdaptiveAvgPool2d((1, 1)), nn.Flatten(),
                                    nn.Linear(24, CLASSES))
        seeded_init(self, 2)


class Pipeline(nn.Module):
    def __init__(self, front_worker, back_worker):
        super().__init__()
        self.front = rpc.remote(front_worker, FrontShard)
        self.back = rpc.remote(back_worker, BackShard)

    def forward(self, batch):
        outputs = []
        for micro in batch.split(MICRO, dim=0):
            front_out = remote_on_owner(FrontShard.forward, self.front, rpc.RRef(micro))
            outputs.append(async_on_owner(BackShard.forward, self.back, front_out))
        return torch.cat(torch.futures.wait_all(outputs))

    def parameter_rrefs(self):
        found = []
        for shard in (self.front, self.back):
            found += remote_on_owner(Shard.parameter_rrefs, shard).to_here()
        return found


def lead():
    model = Pipeline("stage1", "stage2")
    sgd = DistributedOptimizer(optim.SGD, model.parameter_rrefs(), lr=0.05)
    mse = nn.MSELoss()
    rng = np.random.default_rng(77)
    picks = torch.LongTensor(rng.integers(0, CLASSES, BATCH)).view(BATCH, 1)
    targets = torch.zeros(BATCH, CLASSES).scatter_(1, picks, 1.0)
    losses = []
    for step in range(2):
        batch = torch.from_numpy(rng.standard_normal((BATCH, 3, SIDE, SIDE)).astype(np.float32))
        with dist_autograd.context() as context_id:
            loss = mse(model(batch), targets)
            dist_autograd.backward(context_id, [loss])
            sgd.step(context_id)
            losses.append(loss.item())
        print(f"step {step}: loss {losses[-1]:.5f}")
    with torch.no_grad():
        after = mse(model(batch), targets).item()
    print("RESULT", json.dumps({"losses": losses, "after": after}), flush=True)


def run(rank, world_size):
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29500")
    options = rpc.TensorPipeRpcBackendOptions(num_worker_threads=16, rpc_timeout=60)
    name = "lead" if rank == 0 else f"stage{rank}"
    rpc.init_rpc(name, rank=rank, world_size=world_size, rpc_backend_options=options)
    if rank == 0:
        lead()
    rpc.shutdown()  # the stages serve until the lead is done


if __name__ == "__main__":
    mp.spawn(run, args=(3,), nprocs=3, join=True)

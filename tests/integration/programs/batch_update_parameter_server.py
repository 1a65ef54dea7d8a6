"""A parameter server that applies one update per round of trainer gradients and answers
every trainer of the round with the new model, using ``@rpc.functions.async_execution``.

The pattern of PyTorch's batch-RPC parameter server: the server function is a
``@staticmethod`` wrapped in ``@rpc.functions.async_execution`` that returns a
``torch.futures.Future``; trainers that arrive early get the round's future, and the
last one's call runs the optimizer and completes it with ``set_result(model)``, so
each trainer's ``rpc_sync`` returns the whole updated ``nn.Module``. Trainers start
from ``ps_rref.rpc_sync().get_model()``, send ``[p.grad for p in ...]`` back, and the
server accumulates into ``p.grad``, divides, steps ``SGD`` with momentum and zeroes
with ``set_to_none=False``. The server starts the trainers with ``rpc_async`` and
collects their losses with ``torch.futures.wait_all``. As in the example, a gloo process
group is created first on the same MASTER_ADDR/MASTER_PORT (the two share its store),
the backend options set ``num_worker_threads`` and ``rpc_timeout``, and ``mp.spawn``
starts the ranks. The model, a small residual CNN with ``BatchNorm2d``, and each
trainer's batches come from seeded NumPy generators; the gradients of a round are
added under the lock in a fixed order of two, so every library gets the same numbers.
Plain PyTorch.
"""
import json
import os
import threading

import numpy as np
import torch
import torch.distributed as dist
import torch.distributed.rpc as rpc
import torch.multiprocessing as mp
from torch import nn, optim

TRAINERS = 2
ROUNDS = 3
BATCH, SIDE, CLASSES = 6, 12, 5


class ResidualUnit(nn.Module):
    def __init__(self, channels):
        super().__init__()
        self.body = nn.Sequential(
            nn.Conv2d(channels, channels, 3, padding=1, bias=False), nn.BatchNorm2d(channels),
            nn.ReLU(inplace=True),
            nn.Conv2d(channels, channels, 3, padding=1, bias=False), nn.BatchNorm2d(channels))
        self.act = nn.ReLU(inplace=True)

    def forward(self, x):
        out = self.body(x)
        out += x  # the skip connection
        return self.act(out)


class SmallResidualNet(nn.Module):
    def __init__(self, width=6):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, width, 3, padding=1, bias=False),
                                  nn.BatchNorm2d(width), nn.ReLU(inplace=True),
                                  nn.MaxPool2d(kernel_size=2))
        self.unit = ResidualUnit(width)
        self.pool = nn.AdaptiveAvgPool2d((1, 1))
        self.head = nn.Linear(width, CLASSES)
        rng = np.random.default_rng(60)
        with torch.no_grad():
            for m in self.modules():
                if isinstance(m, nn.Conv2d):  # He-normal over the fan-out
                    fan_out = m.out_channels * m.kernel_size[0] * m.kernel_size[1]
                    m.weight.copy_(torch.from_numpy(rng.normal(
                        0, (2.0 / fan_out) ** 0.5, tuple(m.weight.shape)).astype(np.float32)))
                elif isinstance(m, nn.BatchNorm2d):
                    nn.init.ones_(m.weight)
                    nn.init.zeros_(m.bias)
                elif isinstance(m, nn.Linear):
                    m.weight.copy_(torch.from_numpy(
                        rng.uniform(-0.4, 0.4, tuple(m.weight.shape)).astype(np.float32)))
                    m.bias.zero_()

    def forward(self, x):
        return self.head(torch.flatten(self.pool(self.unit(self.stem(x))), 1))


class RoundServer:
    def __init__(self):
        self.model = SmallResidualNet()
        self.optimizer = optim.SGD(self.model.parameters(), lr=0.05, momentum=0.9)
        for p in self.model.parameters():
            p.grad = torch.zeros_like(p)
        self.lock = threading.Lock()
        self.arrived = 0
        self.next_model = torch.futures.Future()

    def get_model(self):
        return self.model

    @staticmethod
    @rpc.functions.async_execution
    def submit_and_wait(server_rref, grads):
        self = server_rref.local_value()
        with self.lock:
            for p, g in zip(self.model.parameters(), grads):
                p.grad += g
            self.arrived += 1
            reply = self.next_model
            if self.arrived == TRAINERS:  # the round is complete: update, answer everyone
                for p in self.model.parameters():
                    p.grad /= TRAINERS
                self.optimizer.step()
                self.optimizer.zero_grad(set_to_none=False)
                self.arrived = 0
                self.next_model = torch.futures.Future()
                reply.set_result(self.model)
        return reply


def train_rounds(server_rref):
    me = rpc.get_worker_info()
    rng = np.random.default_rng(100 + me.id)
    classes = torch.LongTensor(rng.integers(0, CLASSES, BATCH)).view(BATCH, 1)
    targets = torch.zeros(BATCH, CLASSES).scatter_(1, classes, 1.0)  # one-hot
    mse = nn.MSELoss()
    model = server_rref.rpc_sync().get_model()
    losses = []
    for _ in range(ROUNDS):
        pictures = torch.from_numpy(rng.standard_normal((BATCH, 3, SIDE, SIDE)).astype(np.float32))
        loss = mse(model(pictures), targets)
        loss.backward()
        losses.append(loss.item())
        print(f"{me.name}: loss {losses[-1]:.5f}, sending gradients")
        model = rpc.rpc_sync(server_rref.owner(), RoundServer.submit_and_wait,
                             args=(server_rref, [p.grad for p in model.cpu().parameters()]))
    return losses


def run(rank, world_size):
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29500")
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    options = rpc.TensorPipeRpcBackendOptions(num_worker_threads=16, rpc_timeout=60)
    if rank == 0:
        rpc.init_rpc("server", rank=rank, world_size=world_size, rpc_backend_options=options)
        server = RoundServer()
        server_rref = rpc.RRef(server)
        futures = [rpc.rpc_async(f"trainer{r}", train_rounds, args=(server_rref,))
                   for r in range(1, world_size)]
        losses = torch.futures.wait_all(futures)
        print("RESULT", json.dumps({"losses": losses, "weights": [
            p.detach().sum().item() for p in server.model.parameters()]}), flush=True)
    else:  # trainers wait for the server's call
        rpc.init_rpc(f"trainer{rank}", rank=rank, world_size=world_size,
                     rpc_backend_options=options)
    rpc.shutdown()
    dist.destroy_process_group()


if __name__ == "__main__":
    mp.spawn(run, args=(TRAINERS + 1,), nprocs=TRAINERS + 1, join=True)

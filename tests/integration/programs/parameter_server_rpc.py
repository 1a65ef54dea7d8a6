"""A trainer whose model lives on a parameter server, reached over ``torch.distributed.rpc``.

Written the way the RPC parameter-server example is: the server process only runs
``init_rpc`` and ``shutdown``; the trainer asks it, with ``rpc.remote``, to run a
getter that creates the one shared server object under a lock, and holds the returned
``RRef``. Calls on the object go through a helper (``owner_calls.py``) that runs a
method on ``rref.local_value()`` at ``rref.owner()`` with ``rpc_sync``. Each step runs inside
``dist_autograd.context()``: the forward happens on the server, the loss and
``dist_autograd.backward`` on the trainer, the server reads its gradients with
``dist_autograd.get_gradients(context_id)`` (and sends that dict back), and a
``DistributedOptimizer`` built from ``RRef``s of the server's parameters applies SGD
where they live. Both processes are
``mp.Process``es; the trainer gets its ``DataLoader``s as process arguments. The model
is a small CNN on glyph pictures, weights from a seeded NumPy generator, no shuffling,
so every library computes the same numbers. MASTER_ADDR/MASTER_PORT come from the
environment. Plain PyTorch.
"""
import json
import os
import threading

import numpy as np
import torch
import torch.distributed.autograd as dist_autograd
import torch.distributed.rpc as rpc
import torch.multiprocessing as mp
import torch.nn.functional as F
from torch import nn, optim
from torch.distributed.optim import DistributedOptimizer
from torch.utils.data import DataLoader, TensorDataset

from owner_calls import parameter_rrefs, sync_on_owner
from synthetic import glyph_images


class GlyphConvNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(1, 6, 3)              # 12 -> 10
        self.pool_drop = nn.Dropout2d(0.0)          # kept at 0: the runs must agree
        self.fc = nn.Linear(6 * 5 * 5, 4)
        rng = np.random.default_rng(41)
        with torch.no_grad():
            for p in self.parameters():
                values = rng.uniform(-0.25, 0.25, tuple(p.shape))
                p.copy_(torch.from_numpy(values.astype(np.float32)))

    def forward(self, x):
        x = self.pool_drop(F.max_pool2d(F.relu(self.conv(x)), 2))
        return F.log_softmax(self.fc(torch.flatten(x, 1)), dim=1)


class ModelHost:
    """What the server holds: the model, and what trainers may ask of it."""

    def __init__(self):
        self.model = GlyphConvNet()
        self.device = torch.device("cpu")

    def forward(self, x):
        return self.model(x.to(self.device)).to("cpu")  # replies carry CPU tensors

    def parameter_rrefs(self):
        return parameter_rrefs(self.model)

    def gradients(self, context_id):
        """This context's gradients, keyed by parameter; the dict itself travels back."""
        grads = dist_autograd.get_gradients(context_id)
        assert all(p in grads for p in self.model.parameters())
        return {p.to("cpu"): g.to("cpu") for p, g in grads.items()}


_host, _host_lock = None, threading.Lock()


def shared_host():
    global _host
    with _host_lock:  # trainers may ask at once; there must be one host
        if _host is None:
            _host = ModelHost()
        return _host


class RemoteModel(nn.Module):
    """The trainer's handle: looks like a module, computes on the server."""

    def __init__(self):
        super().__init__()
        self.host = rpc.remote("server", shared_host)

    def forward(self, x):
        return sync_on_owner(ModelHost.forward, self.host, x)


def serve(rank, world_size):
    rpc.init_rpc("server", rank=rank, world_size=world_size)
    rpc.shutdown()  # returns once the trainer has finished too


def train(rank, world_size, train_loader, test_loader):
    rpc.init_rpc(f"trainer{rank}", rank=rank, world_size=world_size)
    model = RemoteModel()
    sgd = DistributedOptimizer(optim.SGD, sync_on_owner(ModelHost.parameter_rrefs, model.host),
                               lr=0.1)
    losses, counted = [], []
    for epoch in range(2):
        for pictures, labels in train_loader:
            with dist_autograd.context() as context_id:
                loss = F.nll_loss(model(pictures), labels)
                dist_autograd.backward(context_id, [loss])
                counted.append(len(sync_on_owner(ModelHost.gradients, model.host, context_id)))
                sgd.step(context_id)
                losses.append(loss.item())
        print(f"epoch {epoch}: last loss {losses[-1]:.4f}")
    model.eval()
    hits = 0
    with torch.no_grad():
        for pictures, labels in test_loader:
            hits += model(pictures).argmax(dim=1).eq(labels).sum().item()
    print("RESULT", json.dumps({"losses": losses, "gradients_seen": sorted(set(counted)),
                                "accuracy": hits / len(test_loader.dataset)}), flush=True)
    rpc.shutdown()


if __name__ == "__main__":
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29500")

    def loader(count, seed):
        pictures, labels = glyph_images(count, seed)
        dataset = TensorDataset(torch.from_numpy(pictures), torch.from_numpy(labels))
        return DataLoader(dataset, batch_size=16, shuffle=False)

    processes = [mp.Process(target=serve, args=(0, 2)),
                 mp.Process(target=train, args=(1, 2, loader(96, 50), loader(48, 51)))]
    for p in processes:
        p.start()
    for p in processes:
        p.join()
    assert [p.exitcode for p in processes] == [0, 0], [p.exitcode for p in processes]

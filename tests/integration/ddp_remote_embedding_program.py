"""Data parallelism and RPC in one model: a dense head replicated with
DistributedDataParallel on two trainers, an embedding table held by a parameter server
behind a ``RemoteModule``, written against torch as PyTorch's "Combining DDP with the
Distributed RPC Framework" tutorial combines them.

Four processes (``mp.spawn``): rank 2 leads, rank 3 is the server, ranks 0 and 1 train
and also form a gloo process group of their own (``init_process_group`` with a
``tcp://`` init method) for DDP. The lead creates ``RemoteModule("ps",
nn.EmbeddingBag, ..., kwargs={"mode": "sum"})`` and passes it to both trainers with
``rpc_async``. A trainer's step: look up bags of ids remotely, run the DDP-wrapped head
locally, one ``dist_autograd.backward`` (DDP averages the head's gradients inside the
distributed autograd context), and a ``DistributedOptimizer`` step over the table's
``remote_parameters()`` and ``RRef``s of the head's parameters. Batches are drawn with
``random`` and ``torch``'s ``random_`` after seeding both with the trainer's rank, and
repeat every epoch so the loss can be seen to fall. Each trainer writes its losses and
final head parameters to ``OUT_DIR/trainer<rank>.json``.

    python ddp_remote_embedding_program.py OUT_DIR RPC_PORT PG_PORT EPOCHS
"""
import json
import os
import random
import sys

import torch
import torch.distributed as dist
import torch.distributed.autograd as dist_autograd
import torch.distributed.rpc as rpc
import torch.multiprocessing as mp
from torch import nn, optim
from torch.distributed.nn import RemoteModule
from torch.distributed.optim import DistributedOptimizer
from torch.distributed.rpc import RRef, TensorPipeRpcBackendOptions
from torch.nn.parallel import DistributedDataParallel as DDP

ITEMS, VECTOR, CLASSES, BATCHES = 60, 12, 5, 4


class BagClassifier(nn.Module):
    def __init__(self, table):
        super().__init__()
        self.table = table  # a RemoteModule: forward() runs on the server
        self.head = DDP(nn.Sequential(nn.Linear(VECTOR, 10), nn.ReLU(), nn.Linear(10, CLASSES)))

    def forward(self, ids, starts):
        return self.head(self.table.forward(ids, starts))


def epoch_batches(rank):
    """The same BATCHES batches on every call: bags of item ids (flat ids plus each bag's
    start offset) and one class per bag."""
    random.seed(rank)
    torch.manual_seed(rank)
    for _ in range(BATCHES):
        starts, total = [], 0
        for _ in range(random.randint(6, 12)):
            starts.append(total)
            total += random.randint(1, 6)
        ids = torch.LongTensor(total).random_(0, ITEMS)
        yield ids, torch.LongTensor(starts), torch.LongTensor(len(starts)).random_(CLASSES)


def train(table, rank, epochs, out_dir):
    model = BagClassifier(table)
    parameters = table.remote_parameters() + [RRef(p) for p in model.head.parameters()]
    sgd = DistributedOptimizer(optim.SGD, parameters, lr=0.05)
    criterion = nn.CrossEntropyLoss()
    losses = []
    for epoch in range(epochs):
        for ids, starts, labels in epoch_batches(rank):
            with dist_autograd.context() as context_id:
                loss = criterion(model(ids, starts), labels)
                dist_autograd.backward(context_id, [loss])
                sgd.step(context_id)
                losses.append(loss.item())
        print(f"trainer{rank}: epoch {epoch} done", flush=True)
    with open(os.path.join(out_dir, f"trainer{rank}.json"), "w") as handle:
        json.dump({"losses": losses,
                   "head": [p.detach().tolist() for p in model.head.parameters()]}, handle)


def run(rank, world_size, out_dir, rpc_port, pg_port, epochs):
    options = TensorPipeRpcBackendOptions()
    options.init_method = f"tcp://localhost:{rpc_port}"
    if rank == 2:
        rpc.init_rpc("lead", rank=rank, world_size=world_size, rpc_backend_options=options)
        table = RemoteModule("ps", nn.EmbeddingBag, args=(ITEMS, VECTOR), kwargs={"mode": "sum"})
        running = [rpc.rpc_async(f"trainer{r}", train, args=(table, r, epochs, out_dir))
                   for r in (0, 1)]
        for future in running:
            future.wait()
    elif rank < 2:  # the trainers also need a process group of their own for DDP
        dist.init_process_group("gloo", rank=rank, world_size=2,
                                init_method=f"tcp://localhost:{pg_port}")
        rpc.init_rpc(f"trainer{rank}", rank=rank, world_size=world_size,
                     rpc_backend_options=options)
    else:
        rpc.init_rpc("ps", rank=rank, world_size=world_size, rpc_backend_options=options)
    rpc.shutdown()


if __name__ == "__main__":
    out_dir, rpc_port, pg_port, epochs = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), \
        int(sys.argv[4])
    mp.spawn(run, args=(4, out_dir, rpc_port, pg_port, epochs), nprocs=4, join=True)

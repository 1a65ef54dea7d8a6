"""A CPU port of PyTorch's "Combining DDP with the Distributed RPC Framework" example
(pytorch/examples, distributed/rpc/ddp_rpc), written against torch.

Two trainers hold a dense part (``nn.Linear`` under DistributedDataParallel, over a gloo
process group of the two); a parameter server holds an ``EmbeddingBag`` behind a
``RemoteModule``; a master starts training on the trainers over RPC. Each step runs the
embedding lookup remotely, the dense part locally, one distributed backward (DDP averages
the dense gradients inside the distributed autograd context) and a DistributedOptimizer
step over both parts.

Changes from the original: CPU instead of CUDA, ports and sizes from the command line,
seeded batches repeated every epoch (so the loss can be seen to fall), and each trainer
writes its losses and final dense parameters to ``<out_dir>/trainer<rank>.json``.

    python ddp_rpc_program.py OUT_DIR RPC_PORT PG_PORT EPOCHS
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
import torch.optim as optim
from torch.distributed.nn import RemoteModule
from torch.distributed.optim import DistributedOptimizer
from torch.distributed.rpc import RRef
from torch.distributed.rpc import TensorPipeRpcBackendOptions
from torch.nn.parallel import DistributedDataParallel as DDP

NUM_EMBEDDINGS = 100
EMBEDDING_DIM = 16


class HybridModel(torch.nn.Module):
    """A sparse part (a RemoteModule on the parameter server) and a dense part (nn.Linear
    replicated on the trainers with DistributedDataParallel)."""

    def __init__(self, remote_emb_module):
        super().__init__()
        self.remote_emb_module = remote_emb_module
        self.fc = DDP(torch.nn.Linear(16, 8))

    def forward(self, indices, offsets):
        emb_lookup = self.remote_emb_module.forward(indices, offsets)
        return self.fc(emb_lookup)


def _run_trainer(remote_emb_module, rank, epochs, out_dir):
    model = HybridModel(remote_emb_module)

    # RRefs of every parameter: the embedding table's (remote) and the dense part's (local).
    model_parameter_rrefs = model.remote_emb_module.remote_parameters()
    for param in model.fc.parameters():
        model_parameter_rrefs.append(RRef(param))

    opt = DistributedOptimizer(optim.SGD, model_parameter_rrefs, lr=0.05)
    criterion = torch.nn.CrossEntropyLoss()

    def get_next_batch(rank):
        random.seed(rank)
        torch.manual_seed(rank)
        for _ in range(4):
            num_indices = random.randint(20, 50)
            indices = torch.LongTensor(num_indices).random_(0, NUM_EMBEDDINGS)
            offsets = []
            start = 0
            batch_size = 0
            while start < num_indices:
                offsets.append(start)
                start += random.randint(1, 10)
                batch_size += 1
            offsets_tensor = torch.LongTensor(offsets)
            target = torch.LongTensor(batch_size).random_(8)
            yield indices, offsets_tensor, target

    losses = []
    for epoch in range(epochs):
        for indices, offsets, target in get_next_batch(rank):
            with dist_autograd.context() as context_id:
                output = model(indices, offsets)
                loss = criterion(output, target)
                dist_autograd.backward(context_id, [loss])
                opt.step(context_id)
                losses.append(loss.item())
        print(f"trainer{rank}: epoch {epoch} done", flush=True)
    with open(os.path.join(out_dir, f"trainer{rank}.json"), "w") as fh:
        json.dump({"losses": losses, "fc": [p.detach().tolist() for p in model.fc.parameters()]},
                  fh)


def run_worker(rank, world_size, out_dir, rpc_port, pg_port, epochs):
    rpc_backend_options = TensorPipeRpcBackendOptions()
    rpc_backend_options.init_method = f"tcp://localhost:{rpc_port}"

    # Rank 2 is the master, 3 the parameter server, 0 and 1 are trainers.
    if rank == 2:
        rpc.init_rpc("master", rank=rank, world_size=world_size,
                     rpc_backend_options=rpc_backend_options)
        remote_emb_module = RemoteModule("ps", torch.nn.EmbeddingBag,
                                         args=(NUM_EMBEDDINGS, EMBEDDING_DIM),
                                         kwargs={"mode": "sum"})
        futs = []
        for trainer_rank in [0, 1]:
            futs.append(rpc.rpc_async(f"trainer{trainer_rank}", _run_trainer,
                                      args=(remote_emb_module, trainer_rank, epochs, out_dir)))
        for fut in futs:
            fut.wait()
    elif rank <= 1:
        dist.init_process_group(backend="gloo", rank=rank, world_size=2,
                                init_method=f"tcp://localhost:{pg_port}")
        rpc.init_rpc(f"trainer{rank}", rank=rank, world_size=world_size,
                     rpc_backend_options=rpc_backend_options)
    else:
        rpc.init_rpc("ps", rank=rank, world_size=world_size,
                     rpc_backend_options=rpc_backend_options)

    rpc.shutdown()


if __name__ == "__main__":
    out_dir, rpc_port, pg_port, epochs = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), \
        int(sys.argv[4])
    world_size = 4
    mp.spawn(run_worker, args=(world_size, out_dir, rpc_port, pg_port, epochs),
             nprocs=world_size, join=True)

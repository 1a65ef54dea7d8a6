"""A sequence tagger whose embedding table and output layer live on a parameter server
while its LSTM runs on the trainer, trained end to end with distributed autograd.

The usage of PyTorch's distributed RNN example: the trainer creates the two remote
layers with ``rpc.remote("ps", LayerClass, args=...)``, calls them with ``rpc_sync``
through a helper that runs a method on ``rref.local_value()`` at ``rref.owner()``
(``owner_calls.py``), and
gathers ``RRef``s of every parameter (remote ones by asking their owner, local ones
wrapped in ``RRef`` itself) for a ``DistributedOptimizer``. Each step runs in
``dist_autograd.context()``; the recurrent state is carried across steps and cut with
in-place ``detach_()``; the loss is ``CrossEntropyLoss`` over (batch, classes, time)
scores. Tokens, tags and every weight come from seeded NumPy generators and dropout is
off, so every library computes the same numbers. MASTER_ADDR/MASTER_PORT come from the
environment. Plain PyTorch.
"""
import json
import os

import numpy as np
import torch
import torch.distributed.autograd as dist_autograd
import torch.distributed.rpc as rpc
import torch.multiprocessing as mp
from torch import nn, optim
from torch.distributed.optim import DistributedOptimizer

from owner_calls import parameter_rrefs, sync_on_owner

VOCAB, TAGS, WIDTH, LAYERS = 9, 4, 5, 2
STEPS_PER_EPOCH, EPOCHS, TIME, BATCH = 3, 3, 6, 4


def fill(module, seed, spread=0.15):
    rng = np.random.default_rng(seed)
    with torch.no_grad():
        for p in module.parameters():
            values = rng.uniform(-spread, spread, tuple(p.shape))
            p.copy_(torch.from_numpy(values.astype(np.float32)))


class Lookup(nn.Module):
    """Token ids -> vectors; held by the parameter server."""

    def __init__(self, dropout):
        super().__init__()
        self.table = nn.Embedding(VOCAB, WIDTH)
        self.drop = nn.Dropout(dropout)
        fill(self, 1)

    def forward(self, tokens):
        return self.drop(self.table(tokens))


class TagScores(nn.Module):
    """LSTM outputs -> one score per tag; held by the parameter server."""

    def __init__(self, dropout):
        super().__init__()
        self.drop = nn.Dropout(dropout)
        self.linear = nn.Linear(WIDTH, TAGS)
        fill(self, 2)
        nn.init.zeros_(self.linear.bias)

    def forward(self, states):
        return self.linear(self.drop(states))


class SplitTagger(nn.Module):
    def __init__(self, server, dropout=0.0):
        super().__init__()
        self.lookup = rpc.remote(server, Lookup, args=(dropout,))
        self.lstm = nn.LSTM(WIDTH, WIDTH, LAYERS, dropout=dropout)
        fill(self.lstm, 3)
        self.scores = rpc.remote(server, TagScores, args=(dropout,))

    def forward(self, tokens, state):
        vectors = sync_on_owner(Lookup.forward, self.lookup, tokens)      # (time, batch, width)
        states, state = self.lstm(vectors, state)
        return sync_on_owner(TagScores.forward, self.scores, states), state

    def parameter_rrefs(self):
        return (sync_on_owner(parameter_rrefs, self.lookup) + parameter_rrefs(self.lstm)
                + sync_on_owner(parameter_rrefs, self.scores))


def train():
    rng = np.random.default_rng(90)
    state = tuple(torch.from_numpy(rng.standard_normal((LAYERS, BATCH, WIDTH)).astype(np.float32))
                  for _ in range(2))
    model = SplitTagger("ps")
    sgd = DistributedOptimizer(optim.SGD, model.parameter_rrefs(), lr=0.5)
    criterion = nn.CrossEntropyLoss()
    losses = []
    for epoch in range(EPOCHS):
        for _ in range(STEPS_PER_EPOCH):
            tokens = torch.from_numpy(rng.integers(0, VOCAB, (TIME, BATCH)))
            tags = torch.from_numpy((tokens.numpy() + rng.integers(0, 2, (TIME, BATCH))) % TAGS)
            with dist_autograd.context() as context_id:
                for h in state:
                    h.detach_()  # carry the state, not its history
                scores, state = model(tokens, state)
                # (time, batch, tags) -> (batch, tags, time) against (batch, time) targets
                loss = criterion(scores.permute(1, 2, 0), tags.t())
                dist_autograd.backward(context_id, [loss])
                sgd.step(context_id)
                losses.append(loss.item())
        print(f"epoch {epoch}: loss {losses[-1]:.4f}")
    print("RESULT", json.dumps({"losses": losses}), flush=True)


def run(rank, world_size):
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29500")
    if rank == 1:
        rpc.init_rpc("trainer", rank=rank, world_size=world_size)
        train()
    else:
        rpc.init_rpc("ps", rank=rank, world_size=world_size)
    rpc.shutdown()  # waits for the other side's calls too


if __name__ == "__main__":
    mp.spawn(run, args=(2,), nprocs=2, join=True)

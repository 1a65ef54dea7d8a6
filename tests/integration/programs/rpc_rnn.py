"""An LSTM language model whose embedding table and decoder live on a parameter server.

Port of pytorch/examples `distributed/rpc/rnn` (`rnn.py` and `main.py` in one
file), shrunk: two processes (the trainer and "ps"), a few steps. The tokens and
the starting weights come from seeded NumPy generators and dropout is off, so
both runs see the same numbers. Distributed autograd carries the gradients back
to the server; a DistributedOptimizer updates the parameters where they live.
MASTER_PORT comes from the environment. Plain PyTorch.
"""
import json
import os

import numpy as np
import torch
import torch.distributed.autograd as dist_autograd
import torch.distributed.rpc as rpc
import torch.multiprocessing as mp
import torch.nn as nn
import torch.optim as optim
from torch.distributed.optim import DistributedOptimizer
from torch.distributed.rpc import RRef


def _fill_from_numpy(module, seed):
    rng = np.random.default_rng(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.from_numpy(rng.uniform(-0.1, 0.1, tuple(p.shape)).astype(np.float32)))


# ------------------------------------------------------------------ rnn.py
def _call_method(method, rref, *args, **kwargs):
    """Call a method on the value an RRef holds (runs on the RRef's owner)."""
    return method(rref.local_value(), *args, **kwargs)


def _remote_method(method, rref, *args, **kwargs):
    """Run `method` on the owner of `rref` and fetch the result back."""
    return rpc.rpc_sync(rref.owner(), _call_method, args=[method, rref] + list(args),
                        kwargs=kwargs)


def _parameter_rrefs(module):
    """One RRef for each parameter of a local module."""
    return [RRef(param) for param in module.parameters()]


class EmbeddingTable(nn.Module):
    """The encoding layer of the RNN model, held by the parameter server."""

    def __init__(self, ntoken, ninp, dropout):
        super(EmbeddingTable, self).__init__()
        self.drop = nn.Dropout(dropout)
        self.encoder = nn.Embedding(ntoken, ninp)
        _fill_from_numpy(self, 1)

    def forward(self, input):
        return self.drop(self.encoder(input))


class Decoder(nn.Module):
    """The decoding layer of the RNN model, held by the parameter server."""

    def __init__(self, ntoken, nhid, dropout):
        super(Decoder, self).__init__()
        self.drop = nn.Dropout(dropout)
        self.decoder = nn.Linear(nhid, ntoken)
        _fill_from_numpy(self, 2)
        nn.init.zeros_(self.decoder.bias)

    def forward(self, output):
        return self.decoder(self.drop(output))


class RNNModel(nn.Module):
    """Embedding table and decoder on a remote parameter server, the LSTM here."""

    def __init__(self, ps, ntoken, ninp, nhid, nlayers, dropout=0.0):
        super(RNNModel, self).__init__()
        self.emb_table_rref = rpc.remote(ps, EmbeddingTable, args=(ntoken, ninp, dropout))
        self.rnn = nn.LSTM(ninp, nhid, nlayers, dropout=dropout)
        _fill_from_numpy(self.rnn, 3)
        self.decoder_rref = rpc.remote(ps, Decoder, args=(ntoken, nhid, dropout))

    def forward(self, input, hidden):
        emb = _remote_method(EmbeddingTable.forward, self.emb_table_rref, input)
        output, hidden = self.rnn(emb, hidden)
        decoded = _remote_method(Decoder.forward, self.decoder_rref, output)
        return decoded, hidden

    def parameter_rrefs(self):
        remote_params = []
        remote_params.extend(_remote_method(_parameter_rrefs, self.emb_table_rref))
        remote_params.extend(_parameter_rrefs(self.rnn))
        remote_params.extend(_remote_method(_parameter_rrefs, self.decoder_rref))
        return remote_params


# ----------------------------------------------------------------- main.py
def _run_trainer():
    batch, ntoken, ninp, nhid, nindices, nlayers = 5, 7, 4, 6, 6, 2
    rng = np.random.default_rng(0)
    hidden = (torch.from_numpy(rng.standard_normal((nlayers, nindices, nhid)).astype(np.float32)),
              torch.from_numpy(rng.standard_normal((nlayers, nindices, nhid)).astype(np.float32)))
    model = RNNModel("ps", ntoken, ninp, nhid, nlayers)
    opt = DistributedOptimizer(optim.SGD, model.parameter_rrefs(), lr=1.0)
    criterion = torch.nn.CrossEntropyLoss()

    def get_next_batch():
        for _ in range(3):
            data = torch.from_numpy(rng.integers(0, ntoken, (batch, nindices)))
            target = torch.from_numpy(rng.integers(0, nindices, (batch, ntoken)))
            yield data, target

    losses = []
    for epoch in range(3):
        for data, target in get_next_batch():
            with dist_autograd.context() as context_id:
                hidden[0].detach_()
                hidden[1].detach_()
                output, hidden = model(data, hidden)
                loss = criterion(output, target)
                dist_autograd.backward(context_id, [loss])
                opt.step(context_id)
                losses.append(loss.item())
        print("Training epoch {}".format(epoch))
    print("RESULT", json.dumps({"losses": losses}), flush=True)


def run_worker(rank, world_size):
    os.environ.setdefault("MASTER_ADDR", "localhost")
    os.environ.setdefault("MASTER_PORT", "29500")
    if rank == 1:
        rpc.init_rpc("trainer", rank=rank, world_size=world_size)
        _run_trainer()
    else:
        rpc.init_rpc("ps", rank=rank, world_size=world_size)
    rpc.shutdown()  # block until all RPCs finish


if __name__ == "__main__":
    world_size = 2
    mp.spawn(run_worker, args=(world_size,), nprocs=world_size, join=True)

"""The trainer that each process of ``hogwild_shared_model.py`` runs on the shared model,
and the evaluation the parent runs afterwards. Plain PyTorch."""
import os

import torch
import torch.nn.functional as F
from torch import optim
from torch.utils.data import DataLoader


def train(rank, args, model, dataset, loader_options):
    torch.manual_seed(args.seed + 1 + rank)  # each child shuffles and drops differently
    loader = DataLoader(dataset, **loader_options)
    sgd = optim.SGD(model.parameters(), lr=args.lr, momentum=args.momentum)
    model.train()
    for epoch in range(args.epochs):
        for step, (pictures, labels) in enumerate(loader):
            sgd.zero_grad()
            loss = F.nll_loss(model(pictures), labels)
            loss.backward()
            sgd.step()  # writes straight into the shared parameters
            if step % 8 == 0:
                print(f"pid {os.getpid()} epoch {epoch} step {step} loss {loss.item():.4f}")


def evaluate(model, dataset, loader_options):
    model.eval()
    loss, hits = 0.0, 0
    with torch.no_grad():
        for pictures, labels in DataLoader(dataset, **loader_options):
            scores = model(pictures)
            loss += F.nll_loss(scores, labels, reduction="sum").item()
            hits += scores.max(1)[1].eq(labels).sum().item()
    return loss / len(dataset), hits / len(dataset)

"""Data-parallel training under torchrun with DistributedDataParallel, a DistributedSampler
and resumable snapshots.

A script in the style of PyTorch's DDP tutorial series, run as
``torchrun --standalone --nproc-per-node 2 ddp_snapshot_training.py EPOCHS EVERY``
(on distgrad: ``python -m distgrad.compat.as_torch -m torch.distributed.run ...``):
``init_process_group("gloo")`` from torchrun's environment, ``LOCAL_RANK`` naming the
worker, the model wrapped in ``DDP``, a ``DataLoader`` over a ``DistributedSampler``
(``set_epoch`` every epoch), and rank 0 saving a snapshot dict (``model.module``'s
``state_dict`` and the epochs run) with ``torch.save`` every EVERY epochs; a snapshot
found at start is loaded to resume. The task is a three-way classification of seeded
NumPy points by a small MLP whose starting weights are also seeded; at the end rank 0
reports its per-epoch losses and the saved snapshot read back with ``torch.load``.
Plain PyTorch.
"""
import argparse
import json
import os

import numpy as np
import torch
from torch import nn
from torch.distributed import destroy_process_group, init_process_group
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset
from torch.utils.data.distributed import DistributedSampler

SNAPSHOT = "snapshot.pt"


class LabelledPoints(Dataset):
    """Points in 12 dimensions, labelled by which of three fixed directions they lean to."""

    def __init__(self, count):
        rng = np.random.default_rng(123)
        points = rng.standard_normal((count, 12)).astype(np.float32)
        labels = (points @ rng.standard_normal((12, 3))).argmax(axis=1)
        self.items = [(torch.from_numpy(points[i]), torch.tensor(int(labels[i])))
                      for i in range(count)]

    def __len__(self):
        return len(self.items)

    def __getitem__(self, index):
        return self.items[index]


class Worker:
    def __init__(self, model, loader, optimizer, every):
        self.local_rank = int(os.environ["LOCAL_RANK"])
        self.loader, self.optimizer, self.every = loader, optimizer, every
        self.first_epoch, self.losses = 0, []
        if os.path.exists(SNAPSHOT):
            state = torch.load(SNAPSHOT)
            model.load_state_dict(state["model"])
            self.first_epoch = state["epochs_run"]
            print(f"rank {self.local_rank}: resuming at epoch {self.first_epoch}")
        self.model = DDP(model)
        self.criterion = nn.CrossEntropyLoss()

    def epoch(self, number):
        self.loader.sampler.set_epoch(number)  # a different shuffle each epoch, same on all ranks
        total = 0.0
        for points, labels in self.loader:
            self.optimizer.zero_grad()
            loss = self.criterion(self.model(points), labels)
            loss.backward()  # DDP averages the gradients across ranks here
            self.optimizer.step()
            total += loss.item()
        self.losses.append(total / len(self.loader))
        print(f"rank {self.local_rank} epoch {number}: {len(self.loader)} steps, "
              f"mean loss {self.losses[-1]:.4f}")

    def snapshot(self, epochs_run):
        torch.save({"model": self.model.module.state_dict(), "epochs_run": epochs_run}, SNAPSHOT)

    def fit(self, epochs):
        for number in range(self.first_epoch, epochs):
            self.epoch(number)
            if self.local_rank == 0 and (number + 1) % self.every == 0:
                self.snapshot(number + 1)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("epochs", type=int)
    parser.add_argument("every", type=int, help="snapshot every this many epochs")
    parser.add_argument("--batch-size", type=int, default=24)
    args = parser.parse_args()

    init_process_group(backend="gloo")
    dataset = LabelledPoints(384)
    model = nn.Sequential(nn.Linear(12, 16), nn.Tanh(), nn.Linear(16, 3))
    rng = np.random.default_rng(321)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.from_numpy(rng.uniform(-0.3, 0.3, tuple(p.shape)).astype(np.float32)))
    loader = DataLoader(dataset, batch_size=args.batch_size, shuffle=False, pin_memory=True,
                        sampler=DistributedSampler(dataset))
    worker = Worker(model, loader, torch.optim.SGD(model.parameters(), lr=0.3), args.every)
    worker.fit(args.epochs)
    if worker.local_rank == 0:
        saved = torch.load(SNAPSHOT)
        print("RESULT " + json.dumps({
            "losses": worker.losses, "epochs_run": saved["epochs_run"],
            "saved": {k: v.sum().item() for k, v in saved["model"].items()}}), flush=True)
    destroy_process_group()


if __name__ == "__main__":
    main()

"""Hogwild: several processes run SGD on one model whose parameters live in shared memory.

The pattern of PyTorch's Hogwild example: build the model, call ``model.share_memory()``,
``torch.multiprocessing.set_start_method("spawn")``, start one ``mp.Process`` per
trainer with the model as an argument (each child builds its own ``DataLoader`` and
optimizer, in ``hogwild_worker.py``), ``join`` them, and test in the parent the
parameters the children wrote. The model is a small CNN with ``Dropout2d`` and
``F.dropout`` on 16x16 glyph pictures. Initial weights, dropout and shuffling use
torch's generator and the processes race by design, so two libraries agree only in
that the shared parameters moved and the parent's model learned. Plain PyTorch.
"""
import argparse
import json

import torch
import torch.multiprocessing as mp
import torch.nn.functional as F
from torch import nn
from torch.utils.data import TensorDataset

from hogwild_worker import evaluate, train
from synthetic import glyph_images


class SharedNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv_a = nn.Conv2d(1, 8, kernel_size=3)    # 16 -> 14, pooled to 7
        self.conv_b = nn.Conv2d(8, 16, kernel_size=3)   # 7 -> 5, pooled to 2
        self.map_dropout = nn.Dropout2d(0.2)
        self.dense = nn.Linear(16 * 2 * 2, 32)
        self.out = nn.Linear(32, 4)

    def forward(self, x):
        x = F.relu(F.max_pool2d(self.conv_a(x), 2))
        x = F.relu(F.max_pool2d(self.map_dropout(self.conv_b(x)), 2))
        x = F.relu(self.dense(x.view(x.size(0), -1)))
        x = F.dropout(x, p=0.3, training=self.training)
        return F.log_softmax(self.out(x), dim=1)


def glyph_dataset(count, seed):
    pictures, labels = glyph_images(count, seed, size=16)
    return TensorDataset(torch.from_numpy(pictures), torch.from_numpy(labels))


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    for option, default in (("processes", 2), ("epochs", 2), ("batch_size", 32), ("lr", 0.05),
                            ("momentum", 0.5), ("seed", 2)):
        parser.add_argument("--" + option.replace("_", "-"), type=type(default), default=default)
    args = parser.parse_args()

    mp.set_start_method("spawn", force=True)
    torch.manual_seed(args.seed)
    model = SharedNet()
    model.share_memory()  # the gradients are created later, in each child, and stay private
    before = [p.detach().clone() for p in model.parameters()]

    train_set, test_set = glyph_dataset(768, seed=30), glyph_dataset(256, seed=31)
    loader_options = {"batch_size": args.batch_size, "shuffle": True}
    children = [mp.Process(target=train, args=(rank, args, model, train_set, loader_options))
                for rank in range(args.processes)]
    for child in children:
        child.start()
    for child in children:
        child.join()
    assert [c.exitcode for c in children] == [0] * args.processes, [c.exitcode for c in children]

    test_loss, accuracy = evaluate(model, test_set, loader_options)
    moved = all(bool((p.detach() - q).abs().max() > 0) for p, q in zip(model.parameters(), before))
    print("RESULT " + json.dumps({"accuracy": accuracy, "test_loss": test_loss,
                                  "parameters_moved": moved}))

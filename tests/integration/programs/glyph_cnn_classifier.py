"""A small convolutional classifier for 12x12 glyph pictures, trained the way the classic
PyTorch MNIST program trains one.

The usage: an ``nn.Module`` with ``Conv2d``, ``F.relu``, ``F.max_pool2d``, two ``Dropout``
layers, ``torch.flatten`` and ``log_softmax``; ``F.nll_loss`` (mean to train, sum to
test); ``optim.Adadelta`` under a ``StepLR`` schedule stepped once per epoch (its
``get_last_lr()`` reported); ``argmax`` / ``eq`` / ``view_as`` to count hits; and a
``state_dict`` saved with ``torch.save`` and loaded into a fresh model, which must
score the same. Weights, dropout and the shuffling ``DataLoader`` use torch's own
generator, which two libraries do not share, so their runs agree in how well the
model learns, not in every digit. Plain PyTorch.
"""
import argparse
import json
import os
import tempfile

import torch
import torch.nn.functional as F
from torch import nn, optim
from torch.optim.lr_scheduler import StepLR
from torch.utils.data import DataLoader, TensorDataset

from synthetic import glyph_images


class GlyphNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.features1 = nn.Conv2d(1, 6, kernel_size=3)
        self.features2 = nn.Conv2d(6, 12, kernel_size=3)
        self.drop_maps = nn.Dropout(0.2)
        self.hidden = nn.Linear(12 * 4 * 4, 24)
        self.drop_hidden = nn.Dropout(0.4)
        self.classes = nn.Linear(24, 4)

    def forward(self, x):
        x = F.relu(self.features1(x))           # 12 -> 10
        x = F.max_pool2d(F.relu(self.features2(x)), 2)  # 10 -> 8 -> 4
        x = torch.flatten(self.drop_maps(x), 1)
        x = self.drop_hidden(F.relu(self.hidden(x)))
        return F.log_softmax(self.classes(x), dim=1)


def as_dataset(count, seed):
    pictures, labels = glyph_images(count, seed)
    pictures = torch.from_numpy(pictures)
    # standardised with the training pictures' statistics, as a Normalize transform would
    return TensorDataset((pictures - 0.25) / 0.5, torch.from_numpy(labels))


def evaluate(model, loader):
    model.eval()
    total, hits = 0.0, 0
    with torch.no_grad():
        for pictures, labels in loader:
            scores = model(pictures)
            total += F.nll_loss(scores, labels, reduction="sum").item()
            guess = scores.argmax(dim=1, keepdim=True)
            hits += guess.eq(labels.view_as(guess)).sum().item()
    count = len(loader.dataset)
    return total / count, hits / count


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--lr", type=float, default=1.0)
    parser.add_argument("--gamma", type=float, default=0.6)
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args()
    torch.manual_seed(args.seed)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")

    train_loader = DataLoader(as_dataset(384, seed=20), batch_size=24, shuffle=True)
    test_loader = DataLoader(as_dataset(120, seed=21), batch_size=60)
    model = GlyphNet().to(device)
    optimizer = optim.Adadelta(model.parameters(), lr=args.lr)
    schedule = StepLR(optimizer, step_size=1, gamma=args.gamma)
    history = []
    for epoch in range(1, args.epochs + 1):
        model.train()
        for pictures, labels in train_loader:
            optimizer.zero_grad()
            loss = F.nll_loss(model(pictures.to(device)), labels.to(device))
            loss.backward()
            optimizer.step()
        history.append(evaluate(model, test_loader))
        schedule.step()
        print(f"epoch {epoch}: test loss {history[-1][0]:.4f}, accuracy {history[-1][1]:.3f}")

    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "glyph_net.pt")
        torch.save(model.state_dict(), path)
        copy = GlyphNet()
        copy.load_state_dict(torch.load(path))
    assert evaluate(copy, test_loader) == history[-1]
    print("RESULT", json.dumps({"test_loss": [h[0] for h in history],
                                "accuracy": [h[1] for h in history],
                                "lr": schedule.get_last_lr()}))


if __name__ == "__main__":
    main()

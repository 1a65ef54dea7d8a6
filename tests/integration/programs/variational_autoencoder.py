"""A variational autoencoder for 8x8 glyph pictures, trained with the reparameterisation
trick and a Bernoulli likelihood.

The usage it stands for is the VAE every PyTorch user has seen: ``TensorDataset`` and a
shuffling ``DataLoader``, an encoder whose last layer gives mean and log-variance
(split with ``chunk``), ``torch.randn_like`` noise, a ``sigmoid`` decoder, the loss as
``F.binary_cross_entropy(reduction="sum")`` plus the closed-form KL term, ``Adam``,
``model.train()``/``model.eval()`` and ``torch.no_grad()`` for testing, and decoding
prior samples drawn with ``torch.randn``. Initial weights, the noise and the shuffle
all come from torch's own generator (seeded with ``manual_seed``), which two libraries
do not share: their runs agree only in how the losses fall. Plain PyTorch.
"""
import argparse
import json

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn, optim
from torch.utils.data import DataLoader, TensorDataset

from synthetic import glyph_stencils

SIDE, LATENT = 8, 3


def glyph_set(count, seed):
    """Glyphs with 5% of pixels flipped and intensities in [0.75, 1]: BCE targets."""
    rng = np.random.default_rng(seed)
    kinds = rng.integers(0, 4, count)
    pictures = glyph_stencils(SIDE)[kinds]
    flipped = np.where(rng.random(pictures.shape) < 0.05, 1 - pictures, pictures)
    pictures = flipped * rng.uniform(0.75, 1.0, pictures.shape)
    return TensorDataset(torch.from_numpy(pictures.astype(np.float32)).unsqueeze(1),
                         torch.from_numpy(kinds))


class GlyphVAE(nn.Module):
    def __init__(self, hidden=64):
        super().__init__()
        self.encoder = nn.Sequential(nn.Flatten(), nn.Linear(SIDE * SIDE, hidden), nn.ReLU(),
                                     nn.Linear(hidden, 2 * LATENT))
        self.decoder = nn.Sequential(nn.Linear(LATENT, hidden), nn.ReLU(),
                                     nn.Linear(hidden, SIDE * SIDE))

    def decode(self, z):
        return torch.sigmoid(self.decoder(z))

    def forward(self, pictures):
        mean, log_var = self.encoder(pictures).chunk(2, dim=1)
        z = mean + torch.randn_like(mean) * torch.exp(0.5 * log_var)
        return self.decode(z), mean, log_var


def negative_elbo(pictures, reconstruction, mean, log_var):
    likelihood = F.binary_cross_entropy(reconstruction, pictures.view(-1, SIDE * SIDE),
                                        reduction="sum")
    # KL(N(mean, var) || N(0, 1)), summed over the latent units and the batch
    divergence = 0.5 * torch.sum(mean.pow(2) + log_var.exp() - 1 - log_var)
    return likelihood + divergence


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--seed", type=int, default=3)
    args = parser.parse_args()
    torch.manual_seed(args.seed)

    train_set, test_set = glyph_set(512, seed=10), glyph_set(64, seed=11)
    train_loader = DataLoader(train_set, batch_size=args.batch_size, shuffle=True)
    test_loader = DataLoader(test_set, batch_size=args.batch_size)
    model = GlyphVAE()
    optimizer = optim.Adam(model.parameters(), lr=1e-2)
    train_curve, test_curve = [], []
    for epoch in range(1, args.epochs + 1):
        model.train()
        total = 0.0
        for pictures, _ in train_loader:
            optimizer.zero_grad()
            loss = negative_elbo(pictures, *model(pictures))
            loss.backward()
            optimizer.step()
            total += loss.item()
        train_curve.append(total / len(train_set))

        model.eval()
        with torch.no_grad():
            total = sum(negative_elbo(pictures, *model(pictures)).item()
                        for pictures, _ in test_loader)
            test_curve.append(total / len(test_set))
            dreamt = model.decode(torch.randn(9, LATENT)).view(9, 1, SIDE, SIDE)
            assert dreamt.shape == (9, 1, SIDE, SIDE)
        print(f"epoch {epoch}: train {train_curve[-1]:.3f} test {test_curve[-1]:.3f}")
    print("RESULT", json.dumps({"train": train_curve, "test": test_curve}))


if __name__ == "__main__":
    main()

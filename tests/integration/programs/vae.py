"""A variational autoencoder on small synthetic binary-ish images.

Port of pytorch/examples `vae/main.py`, shrunk (8x8 images made of a few noisy
stroke patterns, `toy_data.py`, instead of MNIST, small layers, two epochs; no image files).
Unchanged otherwise: default initialisation, a shuffling DataLoader and the
reparameterisation noise all draw from torch's random stream, so two libraries
agree on the losses only up to that randomness. Plain PyTorch.
"""
import argparse
import json

import numpy as np
import torch
import torch.utils.data
from torch import nn, optim
from torch.nn import functional as F

from toy_data import stroke_patterns

PIXELS = 64


def synthetic_images(n, seed):
    """Stroke patterns with flipped pixels, in [0, 1] (binary cross-entropy targets)."""
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, 4, n)
    images = stroke_patterns(8)[labels]
    flip = rng.random(images.shape) < 0.05
    images = np.where(flip, 1 - images, images) * rng.uniform(0.8, 1.0, images.shape)
    return torch.from_numpy(images.astype(np.float32)).unsqueeze(1), torch.from_numpy(labels)


class VAE(nn.Module):
    def __init__(self):
        super(VAE, self).__init__()
        self.fc1 = nn.Linear(PIXELS, 32)
        self.fc21 = nn.Linear(32, 4)
        self.fc22 = nn.Linear(32, 4)
        self.fc3 = nn.Linear(4, 32)
        self.fc4 = nn.Linear(32, PIXELS)

    def encode(self, x):
        h1 = F.relu(self.fc1(x))
        return self.fc21(h1), self.fc22(h1)

    def reparameterize(self, mu, logvar):
        std = torch.exp(0.5 * logvar)
        eps = torch.randn_like(std)
        return mu + eps * std

    def decode(self, z):
        h3 = F.relu(self.fc3(z))
        return torch.sigmoid(self.fc4(h3))

    def forward(self, x):
        mu, logvar = self.encode(x.view(-1, PIXELS))
        z = self.reparameterize(mu, logvar)
        return self.decode(z), mu, logvar


# Reconstruction + KL divergence losses summed over all elements and batch
def loss_function(recon_x, x, mu, logvar):
    BCE = F.binary_cross_entropy(recon_x, x.view(-1, PIXELS), reduction="sum")
    # see Appendix B from VAE paper: Kingma and Welling. Auto-Encoding Variational Bayes.
    KLD = -0.5 * torch.sum(1 + logvar - mu.pow(2) - logvar.exp())
    return BCE + KLD


def main():
    parser = argparse.ArgumentParser(description="VAE example")
    parser.add_argument("--batch-size", type=int, default=32, metavar="N")
    parser.add_argument("--epochs", type=int, default=3, metavar="N")
    parser.add_argument("--seed", type=int, default=1, metavar="S")
    parser.add_argument("--log-interval", type=int, default=4, metavar="N")
    args = parser.parse_args()
    torch.manual_seed(args.seed)
    device = torch.device("cpu")

    train_images, train_labels = synthetic_images(256, seed=0)
    test_images, test_labels = synthetic_images(64, seed=1)
    train_loader = torch.utils.data.DataLoader(
        torch.utils.data.TensorDataset(train_images, train_labels),
        batch_size=args.batch_size, shuffle=True)
    test_loader = torch.utils.data.DataLoader(
        torch.utils.data.TensorDataset(test_images, test_labels),
        batch_size=args.batch_size, shuffle=False)

    model = VAE().to(device)
    optimizer = optim.Adam(model.parameters(), lr=1e-2)

    def train(epoch):
        model.train()
        train_loss = 0
        for batch_idx, (data, _) in enumerate(train_loader):
            data = data.to(device)
            optimizer.zero_grad()
            recon_batch, mu, logvar = model(data)
            loss = loss_function(recon_batch, data, mu, logvar)
            loss.backward()
            train_loss += loss.item()
            optimizer.step()
            if batch_idx % args.log_interval == 0:
                print("Train Epoch: {} [{}/{} ({:.0f}%)]\tLoss: {:.6f}".format(
                    epoch, batch_idx * len(data), len(train_loader.dataset),
                    100. * batch_idx / len(train_loader), loss.item() / len(data)))
        average = train_loss / len(train_loader.dataset)
        print("====> Epoch: {} Average loss: {:.4f}".format(epoch, average))
        return average

    def test(epoch):
        model.eval()
        test_loss = 0
        with torch.no_grad():
            for i, (data, _) in enumerate(test_loader):
                data = data.to(device)
                recon_batch, mu, logvar = model(data)
                test_loss += loss_function(recon_batch, data, mu, logvar).item()
        test_loss /= len(test_loader.dataset)
        print("====> Test set loss: {:.4f}".format(test_loss))
        return test_loss

    train_losses, test_losses = [], []
    for epoch in range(1, args.epochs + 1):
        train_losses.append(train(epoch))
        test_losses.append(test(epoch))
        with torch.no_grad():
            sample = torch.randn(16, 4).to(device)
            sample = model.decode(sample).cpu()
            assert sample.view(16, 1, 8, 8).shape == (16, 1, 8, 8)
    print("RESULT", json.dumps({"train": train_losses, "test": test_losses}))


if __name__ == "__main__":
    main()

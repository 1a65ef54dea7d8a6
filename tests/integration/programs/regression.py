"""Fit a random degree-4 polynomial with one Linear layer and plain SGD updates.

Port of pytorch/examples `regression/main.py`, shrunk. The target polynomial and
the batches come from a seeded NumPy generator and the layer starts at zero, so
both runs see the same numbers. Plain PyTorch.
"""
import json
from itertools import count

import numpy as np
import torch
import torch.nn.functional as F

POLY_DEGREE = 4
rng = np.random.default_rng(7)
W_target = torch.from_numpy(rng.standard_normal((POLY_DEGREE, 1)).astype(np.float32)) * 5
b_target = torch.from_numpy(rng.standard_normal(1).astype(np.float32)) * 5


def make_features(x):
    """Builds features i.e. a matrix with columns [x, x^2, x^3, x^4]."""
    x = x.unsqueeze(1)
    return torch.cat([x ** i for i in range(1, POLY_DEGREE + 1)], 1)


def f(x):
    """Approximated function."""
    return x.mm(W_target) + b_target.item()


def poly_desc(W, b):
    """Creates a string description of a polynomial."""
    result = "y = "
    for i, w in enumerate(W):
        result += "{:+.2f} x^{} ".format(w, i + 1)
    result += "{:+.2f}".format(b[0])
    return result


def get_batch(batch_size=32):
    """Builds a batch i.e. (x, f(x)) pair."""
    random = torch.from_numpy(rng.uniform(-1, 1, batch_size).astype(np.float32))
    x = make_features(random)
    y = f(x)
    return x, y


def main():
    fc = torch.nn.Linear(W_target.size(0), 1)
    torch.nn.init.zeros_(fc.weight)
    torch.nn.init.zeros_(fc.bias)
    losses = []
    for batch_idx in count(1):
        batch_x, batch_y = get_batch()
        fc.zero_grad()
        output = F.smooth_l1_loss(fc(batch_x), batch_y)
        loss = output.item()
        output.backward()
        for param in fc.parameters():
            param.data.add_(-0.1 * param.grad)
        if batch_idx % 25 == 0:
            losses.append(loss)
        if loss < 1e-2 or batch_idx >= 400:
            break

    print("Loss: {:.6f} after {} batches".format(loss, batch_idx))
    print("==> Learned function:\t" + poly_desc(fc.weight.view(-1), fc.bias))
    print("==> Actual function:\t" + poly_desc(W_target.view(-1), b_target))
    print("RESULT", json.dumps({"losses": losses, "batches": batch_idx, "final": loss,
                                "weight": fc.weight.view(-1).tolist()}))


if __name__ == "__main__":
    main()

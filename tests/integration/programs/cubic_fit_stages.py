"""Fit tanh on [-3, 3] with a cubic, climbing the stages of PyTorch's "Learning PyTorch
with Examples" one at a time.

Each stage is the same least-squares fit written with one more piece of PyTorch:
plain NumPy with hand-derived gradients; tensors with hand-derived gradients;
``requires_grad`` and ``backward()`` with updates under ``torch.no_grad()``; a custom
``torch.autograd.Function`` (the Hermite polynomial H3, checked with ``gradcheck``);
``nn.Sequential`` with a manual update over ``parameters()``; the same with
``torch.optim.RMSprop``; a custom ``nn.Module`` of scalar ``nn.Parameter``s; and a
module whose depth Python's seeded ``random`` picks on every call, reusing one weight
(dynamic control flow and weight sharing). Starting values are constants so every
library begins in the same place. Plain PyTorch.
"""
import json
import random

import numpy as np
import torch

POINTS = 240
GRID = np.linspace(-3.0, 3.0, POINTS, dtype=np.float32)
START = [0.05, 0.6, 0.0, -0.02]  # c0 + c1 x + c2 x^2 + c3 x^3


def every(step, losses, loss):
    if step % 40 == 39:
        losses.append(float(loss))


def stage_numpy():
    x, y = GRID, np.tanh(GRID)
    c = np.array(START, np.float32)
    losses = []
    for step in range(200):
        powers = np.stack([x ** k for k in range(4)])         # (4, POINTS)
        residual = c @ powers - y
        every(step, losses, np.square(residual).sum())
        c -= 1e-5 * (2.0 * powers @ residual)
    return {"losses": losses, "coefficients": c.tolist()}


def stage_tensors():
    x = torch.tensor(GRID, dtype=torch.float, device=torch.device("cpu"))
    y = torch.tanh(x)
    c = torch.tensor(START)
    losses = []
    for step in range(200):
        powers = torch.stack([x ** k for k in range(4)])
        residual = c @ powers - y
        every(step, losses, residual.pow(2).sum().item())
        grad = 2.0 * powers.mm(residual.unsqueeze(1)).squeeze(1)
        c -= 1e-5 * grad
    return {"losses": losses, "coefficients": c.tolist()}


def stage_autograd():
    x = torch.from_numpy(GRID)
    y = torch.tanh(x)
    c = [torch.tensor(v, requires_grad=True) for v in START]
    losses = []
    for step in range(200):
        prediction = c[0] + c[1] * x + c[2] * x ** 2 + c[3] * x ** 3
        loss = (prediction - y).pow(2).sum()
        every(step, losses, loss.item())
        loss.backward()
        with torch.no_grad():
            for coefficient in c:
                coefficient -= 1e-5 * coefficient.grad
                coefficient.grad = None
    return {"losses": losses, "coefficients": [v.item() for v in c]}


class Hermite3(torch.autograd.Function):
    """The physicists' Hermite polynomial H3(t) = 8t^3 - 12t, derivative by hand."""

    @staticmethod
    def forward(ctx, t):
        ctx.save_for_backward(t)
        return 8 * t ** 3 - 12 * t

    @staticmethod
    def backward(ctx, grad_output):
        (t,) = ctx.saved_tensors
        return grad_output * (24 * t ** 2 - 12)


def stage_custom_function():
    probe = torch.from_numpy(np.random.default_rng(3).standard_normal(5)).requires_grad_()
    checked = torch.autograd.gradcheck(Hermite3.apply, (probe,))
    x = torch.linspace(-3.0, 3.0, POINTS)
    y = torch.tanh(x)
    # y ~ a + b * H3(c + d x); a small d keeps H3 on its monotone stretch at first
    a, b, c, d = (torch.full((), v, dtype=torch.float, requires_grad=True)
                  for v in (0.0, -0.05, 0.0, 0.3))
    losses = []
    for step in range(200):
        prediction = a + b * Hermite3.apply(c + d * x)
        loss = (prediction - y).pow(2).sum()
        every(step, losses, loss.item())
        loss.backward()
        with torch.no_grad():
            for p in (a, b, c, d):
                p -= 1e-5 * p.grad
                p.grad = None
    return {"gradcheck": checked, "losses": losses,
            "coefficients": [p.item() for p in (a, b, c, d)]}


def cubic_features(x):
    # (POINTS, 1) ** (3,) broadcasts to (POINTS, 3): the columns x, x^2, x^3
    return x.unsqueeze(-1).pow(torch.tensor([1, 2, 3]))


def linear_cubic():
    model = torch.nn.Sequential(torch.nn.Linear(3, 1), torch.nn.Flatten(0, 1))
    with torch.no_grad():
        model[0].weight.copy_(torch.tensor([START[1:]]))
        model[0].bias.fill_(START[0])
    return model


def fit_linear_cubic(use_optimizer):
    """The nn stage (zero_grad on the model, a hand-written step over parameters()) or,
    with use_optimizer, the optim stage (RMSprop does both)."""
    x = torch.linspace(-3.0, 3.0, POINTS)
    features, y = cubic_features(x), torch.tanh(x)
    model, loss_fn = linear_cubic(), torch.nn.MSELoss(reduction="sum")
    optimizer = torch.optim.RMSprop(model.parameters(), lr=4e-4) if use_optimizer else None
    losses = []
    for step in range(200):
        loss = loss_fn(model(features), y)
        every(step, losses, loss.item())
        if optimizer is None:
            model.zero_grad()
            loss.backward()
            with torch.no_grad():
                for param in model.parameters():
                    param -= 1e-5 * param.grad
        else:
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    return {"losses": losses, "weight": model[0].weight.detach().flatten().tolist(),
            "bias": model[0].bias.item()}


class Cubic(torch.nn.Module):
    def __init__(self, start):
        super().__init__()
        self.c0, self.c1, self.c2, self.c3 = (torch.nn.Parameter(torch.tensor(v)) for v in start)

    def forward(self, x):
        return self.c0 + self.c1 * x + self.c2 * x ** 2 + self.c3 * x ** 3


class RandomDepth(Cubic):
    """A cubic plus none, one or two of the odd terms x^5, x^7, which share the weight
    `tail`; how many is drawn on every forward."""

    def __init__(self, start):
        super().__init__(start)
        self.tail = torch.nn.Parameter(torch.tensor(0.0))

    def forward(self, x):
        y = super().forward(x)
        for power in range(5, 5 + 2 * random.randint(0, 2), 2):
            y = y + self.tail * x ** power
        return y


def train_module(model, optimizer, steps):
    x = torch.linspace(-3.0, 3.0, POINTS)
    y = torch.tanh(x)
    criterion = torch.nn.MSELoss(reduction="sum")
    losses = []
    for step in range(steps):
        loss = criterion(model(x), y)
        every(step, losses, loss.item())
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return {"losses": losses, "parameters": [p.item() for p in model.parameters()]}


def main():
    random.seed(11)
    module = Cubic(START)
    dynamic = RandomDepth(START)
    result = {
        "numpy": stage_numpy(),
        "tensors": stage_tensors(),
        "autograd": stage_autograd(),
        "custom_function": stage_custom_function(),
        "nn": fit_linear_cubic(use_optimizer=False),
        "optim": fit_linear_cubic(use_optimizer=True),
        "module": train_module(module, torch.optim.SGD(module.parameters(), lr=1e-5), 200),
        "dynamic": train_module(dynamic, torch.optim.SGD(dynamic.parameters(), lr=1e-9,
                                                         momentum=0.9), 200),
    }
    for name, stage in result.items():
        print(f"{name:16s} loss {stage['losses'][0]:10.4f} -> {stage['losses'][-1]:10.4f}")
    print("RESULT", json.dumps(result))


if __name__ == "__main__":
    main()

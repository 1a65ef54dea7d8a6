"""Recover a hidden cubic from noisy samples with a single ``nn.Linear`` over power features.

The usage stands for the small "regression" program people write first: features
built with ``unsqueeze`` and ``torch.cat``, targets made with ``mm``, a
``smooth_l1_loss``, gradients cleared with ``Module.zero_grad()`` and a hand-written
SGD step through ``param.data.add_``, stopping once the loss is small or a step budget
runs out. The hidden coefficients and every sample come from a seeded NumPy
generator and the layer starts at zero, so every library sees the same numbers.
Plain PyTorch.
"""
import json

import numpy as np
import torch
import torch.nn.functional as F

DEGREE = 3
BUDGET = 300
samples = np.random.default_rng(2024)
hidden_weight = torch.from_numpy(samples.uniform(-2, 2, (DEGREE, 1)).astype(np.float32))
hidden_bias = float(samples.uniform(-1, 1))


def powers_of(t):
    """The columns t, t^2, ..., t^DEGREE of a 1-D tensor."""
    column = t.unsqueeze(1)
    return torch.cat([column ** k for k in range(1, DEGREE + 1)], dim=1)


def draw(size=24):
    t = torch.from_numpy(samples.uniform(-1.5, 1.5, size).astype(np.float32))
    features = powers_of(t)
    noise = torch.from_numpy(samples.normal(0, 0.01, (size, 1)).astype(np.float32))
    return features, features.mm(hidden_weight) + hidden_bias + noise


def describe(weight, bias):
    terms = " ".join(f"{w:+.3f}*t^{k}" for k, w in enumerate(weight.tolist(), start=1))
    return f"{terms} {bias:+.3f}"


def main():
    layer = torch.nn.Linear(DEGREE, 1)
    torch.nn.init.zeros_(layer.weight)
    torch.nn.init.zeros_(layer.bias)
    trace, step = [], 0
    while True:
        step += 1
        features, targets = draw()
        layer.zero_grad()
        loss = F.smooth_l1_loss(layer(features), targets)
        loss.backward()
        for p in layer.parameters():
            p.data.add_(p.grad, alpha=-0.05)
        if step % 20 == 0:
            trace.append(loss.item())
        if loss.item() < 5e-3 or step == BUDGET:
            break
    print(f"stopped after {step} steps at loss {loss.item():.5f}")
    print("learned:", describe(layer.weight.view(-1), layer.bias.item()))
    print("hidden: ", describe(hidden_weight.view(-1), hidden_bias))
    print("RESULT", json.dumps({"trace": trace, "steps": step, "last": loss.item(),
                                "weight": layer.weight.view(-1).tolist(),
                                "bias": layer.bias.item()}))


if __name__ == "__main__":
    main()

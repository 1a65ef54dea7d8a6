"""Teach two stacked ``nn.LSTMCell``s to continue phase-shifted sine waves, in float64,
with ``torch.optim.LBFGS``, then let them run free past the end of the data.

It is written the way PyTorch's time-sequence example is used: the waves are made
with NumPy and go through ``torch.save`` / ``torch.load(weights_only=False)`` as an
array, the model is cast with ``.double()`` and ``.to(device)``, the sequence is fed
one column at a time with ``split(1, dim=1)``, LBFGS calls a closure several times per
step, and the forecast feeds each output back as the next input under
``torch.no_grad()``. A parameter with no elements carries the model's device (and
LBFGS must cope with it). Weights are drawn by a seeded NumPy generator. Plain PyTorch.
"""
import argparse
import json
import os
import tempfile

import numpy as np
import torch
from torch import nn

WIDTH = 10


class Forecaster(nn.Module):
    def __init__(self):
        super().__init__()
        self.lower = nn.LSTMCell(1, WIDTH)
        self.upper = nn.LSTMCell(WIDTH, WIDTH)
        self.readout = nn.Linear(WIDTH, 1)
        self.anchor = nn.Parameter(torch.empty(0))  # only says where the model lives

    def blank_state(self, rows):
        def zeros():
            return torch.zeros(rows, WIDTH, dtype=torch.float64).to(self.anchor.device)
        return [(zeros(), zeros()), (zeros(), zeros())]

    def advance(self, value, state):
        state[0] = self.lower(value, state[0])
        state[1] = self.upper(state[0][0], state[1])
        return self.readout(state[1][0])

    def forward(self, seen, ahead=0):
        state = self.blank_state(seen.size(0))
        guesses = [self.advance(column, state) for column in seen.split(1, dim=1)]
        for _ in range(ahead):  # free running: the last guess is the next input
            guesses.append(self.advance(guesses[-1], state))
        return torch.cat(guesses, dim=1)


def write_waves(path, count=9, length=28, period=9.0):
    rng = np.random.default_rng(5)
    phase = rng.uniform(0, 2 * np.pi, (count, 1))
    t = np.arange(length)[None, :]
    torch.save(np.sin(2 * np.pi * t / period + phase), path)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--device", default="cpu")
    options = parser.parse_args()
    device = torch.device(options.device)

    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "waves.pt")
        write_waves(path)
        # an ndarray is not made of tensors: loading it needs the unrestricted unpickler
        waves = torch.from_numpy(torch.load(path, weights_only=False)).to(device)
    train_in, train_out = waves[3:, :-1], waves[3:, 1:]
    check_in, check_out = waves[:3, :-1], waves[:3, 1:]

    model = Forecaster().double().to(device)
    rng = np.random.default_rng(8)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.from_numpy(rng.uniform(-0.35, 0.35, tuple(p.shape))))
    mse = nn.MSELoss()
    optimizer = torch.optim.LBFGS(model.parameters(), lr=0.7, max_iter=7)
    fit, held_out = [], []

    def closure():
        optimizer.zero_grad()
        loss = mse(model(train_in), train_out)
        loss.backward()
        fit.append(loss.item())
        return loss

    for round_ in range(options.rounds):
        optimizer.step(closure)
        with torch.no_grad():
            ahead = 15
            forecast = model(check_in, ahead=ahead)
            held_out.append(mse(forecast[:, :-ahead], check_out).item())
        print(f"round {round_}: fit {fit[-1]:.6f}, held out {held_out[-1]:.6f}")
    print("RESULT", json.dumps({"fit": fit, "held_out": held_out,
                                "forecast_tail": forecast[0, -4:].tolist()}))


if __name__ == "__main__":
    main()

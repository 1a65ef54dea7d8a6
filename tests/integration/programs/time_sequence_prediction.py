"""Two stacked LSTMCells learn sine waves (float64) with LBFGS, then predict the future.

Port of pytorch/examples `time_sequence_prediction` (`generate_sine_wave.py` and
`train.py` in one file; no plots), shrunk. The waves go through `torch.save` /
`torch.load` as a NumPy array, as in the original; the cells start from weights
drawn by a seeded NumPy generator. Plain PyTorch.
"""
import argparse
import json
import os
import tempfile

import numpy as np
import torch
import torch.nn as nn
import torch.optim as optim

HIDDEN = 12


class Sequence(nn.Module):
    def __init__(self):
        super().__init__()
        self.lstm1 = nn.LSTMCell(1, HIDDEN)
        self.lstm2 = nn.LSTMCell(HIDDEN, HIDDEN)
        self.linear = nn.Linear(HIDDEN, 1)
        self.dummy_param = nn.Parameter(torch.empty(0))

    def forward(self, input, future=0):
        outputs = []
        device = self.dummy_param.device
        h_t = torch.zeros(input.size(0), HIDDEN, dtype=torch.double).to(device)
        c_t = torch.zeros(input.size(0), HIDDEN, dtype=torch.double).to(device)
        h_t2 = torch.zeros(input.size(0), HIDDEN, dtype=torch.double).to(device)
        c_t2 = torch.zeros(input.size(0), HIDDEN, dtype=torch.double).to(device)

        for input_t in input.split(1, dim=1):
            h_t, c_t = self.lstm1(input_t, (h_t, c_t))
            h_t2, c_t2 = self.lstm2(h_t, (h_t2, c_t2))
            output = self.linear(h_t2)
            outputs += [output]
        for i in range(future):  # predict the future from the model's own output
            h_t, c_t = self.lstm1(output, (h_t, c_t))
            h_t2, c_t2 = self.lstm2(h_t, (h_t2, c_t2))
            output = self.linear(h_t2)
            outputs += [output]
        return torch.cat(outputs, dim=1)


def generate_sine_wave(path, T=5, L=30, N=8):
    np.random.seed(2)
    x = np.empty((N, L), "int64")
    x[:] = np.array(range(L)) + np.random.randint(-4 * T, 4 * T, N).reshape(N, 1)
    data = np.sin(x / 1.0 / T).astype("float64")
    torch.save(data, open(path, "wb"))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=3, help="steps to run")
    parser.add_argument("--device", type=str, default="cpu", help="training device")
    opt = parser.parse_args()
    device = torch.device(opt.device)
    np.random.seed(0)
    torch.manual_seed(0)

    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "traindata.pt")
        generate_sine_wave(path)
        # a NumPy array is not a "weight": torch.load must be told to trust the file
        data = torch.from_numpy(torch.load(path, weights_only=False)).to(device)
    input = data[3:, :-1]
    target = data[3:, 1:]
    test_input = data[:3, :-1]
    test_target = data[:3, 1:]

    seq = Sequence().to(device).double()
    rng = np.random.default_rng(0)
    with torch.no_grad():
        for p in seq.parameters():
            p.copy_(torch.from_numpy(rng.uniform(-0.3, 0.3, tuple(p.shape))))
    criterion = nn.MSELoss().to(device)
    optimizer = optim.LBFGS(seq.parameters(), lr=0.8, max_iter=8)
    losses, test_losses = [], []
    for i in range(opt.steps):
        print("STEP: ", i)

        def closure():
            optimizer.zero_grad()
            out = seq(input)
            loss = criterion(out, target)
            print("loss:", loss.item())
            losses.append(loss.item())
            loss.backward()
            return loss
        optimizer.step(closure)
        with torch.no_grad():
            future = 20
            pred = seq(test_input, future=future)
            loss = criterion(pred[:, :-future], test_target)
            print("test loss:", loss.item())
            test_losses.append(loss.item())
            y = pred.detach().numpy()
    print("RESULT", json.dumps({"losses": losses, "test_losses": test_losses,
                                "prediction": y[0, -5:].tolist()}))


if __name__ == "__main__":
    main()

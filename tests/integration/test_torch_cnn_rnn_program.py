"""A CNN and an LSTM model written for PyTorch train on distgrad with only the import swapped.

The same source text runs with ``torch`` bound to PyTorch and to distgrad, from the
same initial weights and buffers; losses, parameters and BatchNorm's running
statistics must agree after a few optimizer steps.
"""
import numpy as np
import pytest

import distgrad
from distgrad.testing.oracle import torch as real_torch

pytestmark = pytest.mark.timeout(60)

PROGRAM = '''
nn = torch.nn  # (an import statement would bind the real torch; the test binds the name)
F = torch.nn.functional


class ConvNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(1, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(4, 8, 3, padding="same", padding_mode="reflect", groups=2),
            nn.Dropout2d(0.0), nn.ReLU(), nn.AvgPool2d(2, ceil_mode=True))
        self.pool = nn.AdaptiveAvgPool2d((2, 2))
        self.head = nn.Linear(32, 3)

    def forward(self, x):
        return self.head(self.pool(self.features(x)).reshape(x.shape[0], -1))


class SeqNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv1d(3, 5, 3, padding=1)
        self.bn = nn.BatchNorm1d(5)
        self.lstm = nn.LSTM(5, 6, num_layers=2, batch_first=True, bidirectional=True)
        self.gru = nn.GRUCell(12, 4)
        self.head = nn.Linear(4, 3)

    def forward(self, x):                                   # x: (batch, 3, length)
        h = F.max_pool1d(F.relu(self.bn(self.conv(x))), 2)
        out, (h_n, c_n) = self.lstm(h.transpose(1, 2))
        state = None
        for t in range(out.shape[1]):
            state = self.gru(out[:, t], state)
        return self.head(state)


def train(model, x, y, steps):
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    losses = []
    for _ in range(steps):
        opt.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    model.eval()
    with torch.no_grad():
        losses.append(F.cross_entropy(model(x), y).item())
    return losses
'''

CASES = {"ConvNet": (8, 1, 8, 8), "SeqNet": (4, 3, 8)}


def _run(module, name, init, x, y, steps=4):
    scope = {"torch": module}
    exec(PROGRAM, scope)  # noqa: S102 - our own test program text
    model = scope[name]()
    model.load_state_dict({k: module.tensor(v) for k, v in init.items()})
    losses = scope["train"](model, module.tensor(x), module.tensor(y), steps)
    return losses, {k: v.detach().numpy().copy() for k, v in model.state_dict().items()}


@pytest.mark.skipif(real_torch is None, reason="PyTorch (the oracle) is not installed")
@pytest.mark.parametrize("name", sorted(CASES))
def test_same_program_same_result(name):
    probe = {"torch": distgrad}
    exec(PROGRAM, probe)  # noqa: S102
    distgrad.manual_seed(0)
    init = {k: v.detach().numpy().copy() for k, v in probe[name]().state_dict().items()}
    rng = np.random.default_rng(0)
    x = rng.standard_normal(CASES[name]).astype(np.float32)
    y = rng.integers(0, 3, CASES[name][0])
    threads = real_torch.get_num_threads()
    real_torch.set_num_threads(1)  # tiny ops: more threads only contend on a shared machine
    try:
        ours, theirs = _run(distgrad, name, init, x, y), _run(real_torch, name, init, x, y)
    finally:
        real_torch.set_num_threads(threads)
    np.testing.assert_allclose(ours[0], theirs[0], rtol=1e-4, atol=1e-5)
    assert list(ours[1]) == list(theirs[1])
    for k in init:
        np.testing.assert_allclose(ours[1][k], theirs[1][k], rtol=1e-4, atol=1e-5, err_msg=k)


@pytest.mark.parametrize("name", sorted(CASES))
def test_program_trains_without_torch(name):
    scope = {"torch": distgrad}
    exec(PROGRAM, scope)  # noqa: S102
    distgrad.manual_seed(1)
    model = scope[name]()
    x = distgrad.randn(*CASES[name])
    y = distgrad.randint(0, 3, (CASES[name][0],))
    losses = scope["train"](model, x, y, steps=6)
    assert losses[5] < losses[0]

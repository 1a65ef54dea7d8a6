"""Modules and functions the RPC tests send to and run on workers (allowed there)."""
import distgrad
from distgrad import nn


class TwoLayer(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4), nn.Tanh())
        self.head = nn.Linear(4, 2)
        self.head.weight = nn.Parameter(self.head.weight.detach().clone())
        self.act = distgrad.nn.functional.relu

    def forward(self, x):
        return self.act(self.head(self.body(x)))


def train_step(model, opt_state, x):
    """One Adam step on ``model`` (resuming ``opt_state`` if given); returns the trained
    model, the optimizer's state_dict and the loss."""
    opt = distgrad.optim.Adam(model.parameters(), lr=0.05)
    if opt_state is not None:
        opt.load_state_dict(opt_state)
    opt.zero_grad()
    loss = model(x).pow(2).mean()
    loss.backward()
    opt.step()
    return model, opt.state_dict(), loss.item()

"""An older-style PyTorch program (legacy constructors, a policy-gradient loss on
``torch.distributions``, one-hot by ``scatter_``, an lr schedule, f-string logging of
tensors) runs on distgrad with only the import swapped, and trains to the same weights."""
import io

import numpy as np
import pytest

import distgrad
from distgrad.testing.oracle import torch as real_torch

pytestmark = pytest.mark.timeout(60)

PROGRAM = '''
class Policy(torch.nn.Module):
    def __init__(self, n_in, n_actions):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.Tensor(n_actions, n_in))
        self.bias = torch.nn.Parameter(torch.Tensor(n_actions))
        self.weight.data.uniform_(-0.5, 0.5)
        self.bias.data.zero_()

    def forward(self, x):
        return x.mm(self.weight.t()) + self.bias


def train(policy, states, actions, rewards, steps, log):
    assert isinstance(actions, torch.LongTensor) and isinstance(rewards, torch.FloatTensor)
    opt = torch.optim.RMSprop(policy.parameters(), lr=0.05, momentum=0.5, centered=True)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=0.1, total_steps=steps)
    for step in range(steps):
        logits = policy(states)
        dist = torch.distributions.Categorical(logits=logits)
        onehot = torch.zeros(len(actions), logits.size(1)).scatter_(1, actions.unsqueeze(1), 1.0)
        counts = torch.zeros(logits.size(1)).index_add_(0, actions, torch.ones(len(actions)))
        advantage = (rewards - rewards.mean()) / (rewards.std() + 1e-8)
        loss = (-(dist.log_prob(actions) * advantage).mean() - 0.01 * dist.entropy().mean()
                + 1e-3 * (onehot * logits).sum() / counts.sum())
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
        log.write(f"step {step:2d} loss {loss:.4f} lr {sched.get_last_lr()[0]:.5f} "
                  + "kl {:+.3f}\\n".format(torch.distributions.kl_divergence(
                      dist, torch.distributions.Categorical(logits=torch.zeros_like(logits)))
                      .mean().detach()))
    return loss.item()
'''


def _run(module, steps=12):
    rng = np.random.default_rng(0)
    states = module.FloatTensor(rng.standard_normal((16, 5)).tolist())
    actions = module.LongTensor(rng.integers(0, 3, 16).tolist())
    rewards = module.FloatTensor(rng.standard_normal(16).tolist())
    scope = {"torch": module}
    exec(PROGRAM, scope)  # noqa: S102 - our own test program text
    policy = scope["Policy"](5, 3)
    with module.no_grad():  # the same start in both libraries
        policy.weight.copy_(module.tensor(rng.uniform(-0.5, 0.5, (3, 5)).astype(np.float32)))
    log = io.StringIO()
    final = scope["train"](policy, states, actions, rewards, steps, log)
    return final, log.getvalue().splitlines(), policy.weight.detach().numpy().copy()


def test_runs_on_distgrad():
    final, lines, _ = _run(distgrad)
    assert len(lines) == 12 and lines[0].startswith("step  0 loss ")
    assert np.isfinite(final)


@pytest.mark.skipif(real_torch is None, reason="PyTorch (the oracle) is not installed")
def test_matches_torch():
    final, lines, weight = _run(distgrad)
    t_final, t_lines, t_weight = _run(real_torch)
    np.testing.assert_allclose(weight, t_weight, rtol=1e-4, atol=1e-5)
    assert final == pytest.approx(t_final, rel=1e-4)
    ours = [[float(w) for w in line.split()[3::2]] for line in lines]
    theirs = [[float(w) for w in line.split()[3::2]] for line in t_lines]
    np.testing.assert_allclose(ours, theirs, atol=2e-3)

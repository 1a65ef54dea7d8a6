"""Run each parameter's optimizer step inside backward, as soon as its gradient is final.

The technique of PyTorch's "optimizer step in backward" tutorial: instead of one
``Adam`` stepped after ``backward()``, give every parameter an ``Adam`` of its own
(``foreach=False``) and step it from ``Tensor.register_post_accumulate_grad_hook``, then
drop the gradient at once, so that no full set of gradients is ever alive. The program
trains a small ``Flatten`` / ``Linear`` / ``GELU`` / ``LayerNorm`` regressor both ways
from the same seeded NumPy weights on the same batches, and reports the weights after
each (they must agree), that no gradient is left behind, and each optimizer's step
count read from its ``state``. Plain PyTorch.
"""
import json

import numpy as np
import torch
from torch import nn

STEPS = 4
data = np.random.default_rng(4)
batches = [(torch.from_numpy(data.standard_normal((6, 2, 5)).astype(np.float32)),
            torch.from_numpy(data.standard_normal((6, 3)).astype(np.float32)))
           for _ in range(STEPS)]


def fresh_regressor():
    net = nn.Sequential(nn.Flatten(), nn.Linear(10, 24), nn.GELU(), nn.LayerNorm(24),
                        nn.Linear(24, 3))
    weights = np.random.default_rng(9)
    with torch.no_grad():
        for p in net.parameters():
            p.copy_(torch.from_numpy(weights.normal(0, 0.2, tuple(p.shape)).astype(np.float32)))
    return net


def squared_error(net, inputs, targets):
    return (net(inputs) - targets).pow(2).mean()


# the usual loop: backward fills every .grad, then one optimizer steps them all
net = fresh_regressor()
adam = torch.optim.Adam(net.parameters(), lr=0.01)
for inputs, targets in batches:
    squared_error(net, inputs, targets).backward()
    adam.step()
    adam.zero_grad()
after_loop = [p.detach().sum().item() for p in net.parameters()]
del adam

# the fused loop: a hook per parameter steps that parameter's own optimizer
net = fresh_regressor()
per_parameter = {p: torch.optim.Adam([p], lr=0.01, foreach=False) for p in net.parameters()}


def step_now(param):
    per_parameter[param].step()
    per_parameter[param].zero_grad()  # the gradient is spent: free it right away


handles = [p.register_post_accumulate_grad_hook(step_now) for p in net.parameters()]
for inputs, targets in batches:
    squared_error(net, inputs, targets).backward()  # nothing to call afterwards
after_hooks = [p.detach().sum().item() for p in net.parameters()]
for handle in handles:
    handle.remove()

print("RESULT " + json.dumps({
    "loop": after_loop, "hooks": after_hooks,
    "grads_left": [p.grad is not None for p in net.parameters()],
    "steps": [per_parameter[p].state[p]["step"].item() for p in net.parameters()]}))

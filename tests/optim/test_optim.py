"""Optimizers: several steps of each match PyTorch's parameters; groups and state dicts.

More configurations of the other optimizers, and LBFGS: ``test_optimizers_more.py``."""
import copy

import numpy as np
import pytest

import distgrad
from distgrad import nn, optim
from distgrad.testing.oracle import torch

CONFIGS = [
    ("SGD", {"lr": 0.1}),
    ("SGD", {"lr": 0.1, "momentum": 0.9}),
    ("SGD", {"lr": 0.05, "momentum": 0.9, "dampening": 0.2, "weight_decay": 0.01}),
    ("SGD", {"lr": 0.05, "momentum": 0.8, "nesterov": True, "weight_decay": 0.1}),
    ("SGD", {"lr": 0.05, "maximize": True}),
    ("Adam", {"lr": 0.01}),
    ("Adam", {"lr": 0.01, "betas": (0.8, 0.99), "weight_decay": 0.1, "amsgrad": True}),
    ("AdamW", {"lr": 0.01}),
    ("AdamW", {"lr": 0.02, "weight_decay": 0.3, "amsgrad": True}),
    ("Adadelta", {"lr": 1.0}),
    ("Adagrad", {"lr": 0.05}),
    ("RMSprop", {"lr": 0.01}),
    ("Adamax", {"lr": 0.05}),
    ("NAdam", {"lr": 0.05}),
    ("RAdam", {"lr": 0.05}),
]


def _train(lib, name, kwargs, steps=6):
    rng = np.random.default_rng(0)
    w0 = rng.standard_normal((4, 3)).astype(np.float32)
    b0 = rng.standard_normal(4).astype(np.float32)
    x = lib.tensor(rng.standard_normal((8, 3)).astype(np.float32))
    y = lib.tensor(rng.standard_normal((8, 4)).astype(np.float32))
    w = lib.nn.Parameter(lib.tensor(w0))
    b = lib.nn.Parameter(lib.tensor(b0))
    opt = getattr(lib.optim, name)([{"params": [w]}, {"params": [b], "lr": kwargs["lr"] / 2}],
                                   **kwargs)
    for _ in range(steps):
        opt.zero_grad()
        loss = ((lib.nn.functional.linear(x, w, b).tanh() - y) ** 2).mean()
        loss.backward()
        opt.step()
    return w.detach().numpy().copy(), b.detach().numpy().copy(), opt


@pytest.mark.parametrize("name,kwargs", CONFIGS, ids=lambda v: str(v))
def test_matches_torch(name, kwargs):
    if torch is None:
        pytest.skip("torch not installed")
    w, b, _ = _train(distgrad, name, kwargs)
    tw, tb, _ = _train(torch, name, kwargs)
    np.testing.assert_allclose(w, tw, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(b, tb, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name,kwargs", CONFIGS, ids=lambda v: str(v))
def test_loss_decreases(name, kwargs):
    """... or increases, with maximize=True."""
    rng = np.random.default_rng(1)
    x = distgrad.tensor(rng.standard_normal((16, 3)).astype(np.float32))
    y = distgrad.tensor(rng.standard_normal((16, 1)).astype(np.float32))
    model = nn.Linear(3, 1)
    opt = getattr(optim, name)(model.parameters(), **kwargs)
    losses = []
    for _ in range(30):
        opt.zero_grad()
        loss = nn.MSELoss()(model(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    if kwargs.get("maximize"):
        assert losses[-1] > losses[0]
    else:
        assert losses[-1] < losses[0]


def test_state_dict_round_trip_continues_identically():
    _, _, opt = _train(distgrad, "Adam", {"lr": 0.01}, steps=3)
    sd = opt.state_dict()
    assert sorted(sd) == ["param_groups", "state"]
    assert sd["param_groups"][0]["params"] == [0] and sd["param_groups"][1]["params"] == [1]
    assert sorted(sd["state"][0]) == ["exp_avg", "exp_avg_sq", "step"]
    assert sd["state"][0]["step"].item() == 3.0
    params = [p for g in opt.param_groups for p in g["params"]]
    clones = [nn.Parameter(p.detach().clone()) for p in params]
    other = optim.Adam([{"params": [clones[0]]}, {"params": [clones[1]], "lr": 0.005}], lr=0.01)
    other.load_state_dict(copy.deepcopy(sd))
    for p, c in zip(params, clones):
        g = distgrad.ones(*p.shape)
        p.grad, c.grad = g, g.clone()
    opt.step()
    other.step()
    for p, c in zip(params, clones):
        np.testing.assert_array_equal(p.detach().numpy(), c.detach().numpy())


def test_state_dict_layout_matches_torch():
    if torch is None:
        pytest.skip("torch not installed")
    for name in ("SGD", "Adam", "AdamW"):
        kwargs = {"lr": 0.1, "momentum": 0.9} if name == "SGD" else {"lr": 0.1}
        _, _, ours = _train(distgrad, name, kwargs, steps=2)
        _, _, theirs = _train(torch, name, kwargs, steps=2)
        a, b = ours.state_dict(), theirs.state_dict()
        assert [sorted(g) for g in a["param_groups"]] == [sorted(g) for g in b["param_groups"]]
        assert {k: sorted(v) for k, v in a["state"].items()} == \
            {k: sorted(v) for k, v in b["state"].items()}


def test_zero_grad_and_groups():
    p, q = nn.Parameter(distgrad.ones(2)), nn.Parameter(distgrad.ones(2))
    opt = optim.SGD([p], lr=0.1)
    opt.add_param_group({"params": q, "lr": 0.5})
    assert [g["lr"] for g in opt.param_groups] == [0.1, 0.5]
    assert opt.param_groups[1]["momentum"] == 0
    with pytest.raises(ValueError):
        opt.add_param_group({"params": [p]})
    p.grad, q.grad = distgrad.ones(2), distgrad.ones(2)
    opt.step()
    assert p.tolist() == pytest.approx([0.9, 0.9]) and q.tolist() == pytest.approx([0.5, 0.5])
    opt.zero_grad(set_to_none=False)
    assert p.grad.tolist() == [0.0, 0.0]
    opt.zero_grad()
    assert p.grad is None and q.grad is None
    opt.step()  # parameters without gradients are skipped
    assert p.tolist() == pytest.approx([0.9, 0.9])


def test_bad_arguments():
    p = nn.Parameter(distgrad.ones(1))
    with pytest.raises(ValueError):
        optim.SGD([p], lr=-1)
    with pytest.raises(ValueError):
        optim.SGD([p], lr=0.1, nesterov=True)
    with pytest.raises(ValueError):
        optim.Adam([p], betas=(1.0, 0.9))
    with pytest.raises(ValueError):
        optim.SGD([], lr=0.1)
    with pytest.raises(TypeError):
        optim.SGD(p, lr=0.1)


def test_step_closure_and_hooks():
    p = nn.Parameter(distgrad.tensor([2.0]))
    opt = optim.SGD([p], lr=0.25)
    events = []
    opt.register_step_pre_hook(lambda o, a, k: events.append("pre"))
    h = opt.register_step_post_hook(lambda o, a, k: events.append("post"))

    def closure():
        opt.zero_grad()
        loss = (p * p).sum()
        loss.backward()
        return loss

    loss = opt.step(closure)
    assert loss.item() == 4.0 and p.item() == 1.0
    h.remove()
    opt.step(closure)
    assert events == ["pre", "post", "pre"]


def test_version_counter_bumped_by_step():
    # A step must invalidate tensors saved for a pending backward, as PyTorch does.
    p = nn.Parameter(distgrad.tensor([2.0]))
    y = (p * p).sum()
    p.grad = distgrad.ones(1)
    optim.SGD([p], lr=0.1).step()
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        y.backward()

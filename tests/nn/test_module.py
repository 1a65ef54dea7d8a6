"""The Module API: registration, iteration, state dicts, modes, dtype moves, repr, containers."""
import copy
import pickle

import numpy as np
import pytest

import distgrad
from distgrad import nn
from distgrad.testing.oracle import torch


def make_net(lib):
    class Net(lib.nn.Module):
        def __init__(self):
            super().__init__()
            nn_ = lib.nn
            self.body = nn_.Sequential(nn_.Linear(3, 4), nn_.ReLU(), nn_.Dropout(0.5))
            self.heads = nn_.ModuleDict({"a": nn_.Linear(4, 2), "b": nn_.LayerNorm(4)})
            self.extra = nn_.ModuleList([nn_.Embedding(5, 4)])
            self.register_buffer("steps", lib.zeros(1))
            self.register_buffer("scratch", lib.ones(2), persistent=False)

        def forward(self, x):
            return self.heads["a"](self.heads["b"](self.body(x)))

    return Net()


def Net():
    return make_net(distgrad)


def test_named_members_and_children():
    net = Net()
    assert [n for n, _ in net.named_parameters()] == [
        "body.0.weight", "body.0.bias", "heads.a.weight", "heads.a.bias", "heads.b.weight",
        "heads.b.bias", "extra.0.weight"]
    assert [n for n, _ in net.named_buffers()] == ["steps", "scratch"]
    assert [n for n, _ in net.named_children()] == ["body", "heads", "extra"]
    assert [n for n, _ in net.named_modules()][:4] == ["", "body", "body.0", "body.1"]
    assert len(list(net.modules())) == 10
    assert all(isinstance(p, nn.Parameter) and p.requires_grad for p in net.parameters())
    assert list(net.parameters(recurse=False)) == []
    assert net.get_submodule("heads.a") is net.heads["a"]
    assert net.get_parameter("body.0.bias") is net.body[0].bias


def test_shared_parameter_listed_once():
    lin = nn.Linear(2, 2)
    seq = nn.Sequential(lin, lin)
    assert len(list(seq.parameters())) == 2
    assert len(list(seq.named_parameters(remove_duplicate=False))) == 4


def test_setattr_rules():
    m = nn.Module()
    m.w = nn.Parameter(distgrad.ones(2))
    assert "w" in m._parameters
    with pytest.raises(TypeError):
        m.w = distgrad.ones(2)
    m.w = None
    assert m.w is None
    m.sub = nn.Linear(1, 1)
    assert "sub" in m._modules
    del m.sub
    assert not hasattr(m, "sub")
    with pytest.raises(ValueError):
        m.register_parameter("v", _non_leaf_param())


def _non_leaf_param():
    p = nn.Parameter(distgrad.ones(1))
    q = p * 2
    q.__class__ = nn.Parameter
    return q


def test_state_dict_round_trip():
    a, b = Net(), Net()
    sd = a.state_dict()
    assert list(sd) == ["steps", "body.0.weight", "body.0.bias", "heads.a.weight", "heads.a.bias",
                        "heads.b.weight", "heads.b.bias", "extra.0.weight"]
    assert all(not t.requires_grad for t in sd.values())
    result = b.load_state_dict(sd)
    assert result.missing_keys == [] and result.unexpected_keys == []
    for (n1, p1), (n2, p2) in zip(a.named_parameters(), b.named_parameters()):
        np.testing.assert_array_equal(p1.detach().numpy(), p2.detach().numpy())
    sd.pop("steps")
    sd["nope"] = distgrad.ones(1)
    with pytest.raises(RuntimeError, match='Missing key\\(s\\) in state_dict: "steps"'):
        b.load_state_dict(sd)
    result = b.load_state_dict(sd, strict=False)
    assert result.missing_keys == ["steps"] and result.unexpected_keys == ["nope"]
    bad = a.state_dict()
    bad["body.0.weight"] = distgrad.ones(9, 9)
    with pytest.raises(RuntimeError, match="size mismatch for body.0.weight"):
        b.load_state_dict(bad)


def test_state_dict_keys_match_torch():
    if torch is None:
        pytest.skip("torch not installed")
    assert list(Net().state_dict()) == list(make_net(torch).state_dict())


def test_train_eval_requires_grad_zero_grad_apply():
    net = Net()
    net.eval()
    assert not any(m.training for m in net.modules())
    net.train()
    assert all(m.training for m in net.modules())
    net(distgrad.ones(2, 3)).sum().backward()
    assert net.body[0].weight.grad is not None
    net.zero_grad(set_to_none=False)
    assert float(net.body[0].weight.grad.abs().sum()) == 0.0
    net.zero_grad()
    assert net.body[0].weight.grad is None
    net.requires_grad_(False)
    assert not any(p.requires_grad for p in net.parameters())
    seen = []
    net.apply(lambda m: seen.append(type(m).__name__))
    assert seen[-1] == "Net" and seen[0] == "Linear"


def test_dropout_train_vs_eval():
    d = nn.Dropout(0.5)
    x = distgrad.ones(1000)
    y = d(x)
    zeros = float((y == 0).sum())
    assert 350 < zeros < 650
    assert set(np.unique(y.numpy()).tolist()) <= {0.0, 2.0}
    d.eval()
    assert d(x) is x or np.array_equal(d(x).numpy(), x.numpy())


def test_to_dtype():
    net = Net().to(distgrad.float64)
    assert all(p.dtype == distgrad.float64 for p in net.parameters())
    assert net.steps.dtype == distgrad.float64
    assert all(isinstance(p, nn.Parameter) for p in net.parameters())
    out = net(distgrad.ones(2, 3, dtype=distgrad.float64))
    assert out.dtype == distgrad.float64
    net.float()
    assert all(p.dtype == distgrad.float32 for p in net.parameters())


def test_repr_matches_torch():
    if torch is None:
        pytest.skip("torch not installed")
    assert repr(Net()) == repr(make_net(torch)).replace("torch", "distgrad")
    assert repr(nn.GELU()) == repr(torch.nn.GELU())
    assert repr(nn.ReLU(inplace=True)) == repr(torch.nn.ReLU(inplace=True))


def test_parameter_repr_and_copy():
    p = nn.Parameter(distgrad.tensor([1.0, 2.0]))
    assert repr(p).startswith("Parameter containing:\n")
    q = copy.deepcopy(p)
    assert isinstance(q, nn.Parameter) and q is not p and q.requires_grad
    r = pickle.loads(pickle.dumps(p))
    assert isinstance(r, nn.Parameter) and r.tolist() == [1.0, 2.0]


def test_deepcopy_module_is_independent():
    net = Net()
    other = copy.deepcopy(net)
    with distgrad.no_grad():
        other.body[0].weight.fill_(0)
    assert float(net.body[0].weight.abs().sum()) > 0
    assert [n for n, _ in other.named_parameters()] == [n for n, _ in net.named_parameters()]


def test_containers():
    seq = nn.Sequential(nn.Linear(2, 3), nn.ReLU(), nn.Linear(3, 1))
    assert len(seq) == 3 and isinstance(seq[-1], nn.Linear)
    assert isinstance(seq[1:], nn.Sequential) and len(seq[1:]) == 2
    seq.append(nn.Sigmoid())
    del seq[0]
    assert [k for k in seq._modules] == ["0", "1", "2"]
    ml = nn.ModuleList([nn.ReLU()])
    ml.append(nn.Tanh())
    ml += [nn.GELU()]
    assert [type(m).__name__ for m in ml] == ["ReLU", "Tanh", "GELU"]
    md = nn.ModuleDict({"x": nn.ReLU()})
    md["y"] = nn.Tanh()
    assert list(md.keys()) == ["x", "y"] and "y" in md and len(md) == 2
    assert len(list(nn.Sequential(md, ml).parameters())) == 0


def test_registration_hooks():
    mm = nn.modules.module
    seen = []
    handles = [mm.register_module_parameter_registration_hook(lambda m, n, p: seen.append(("p", n))),
               mm.register_module_module_registration_hook(lambda m, n, s: seen.append(("m", n))),
               mm.register_module_buffer_registration_hook(lambda m, n, b: seen.append(("b", n)))]
    try:
        m = nn.Module()
        m.w = nn.Parameter(distgrad.ones(1))
        m.sub = nn.ReLU()
        m.register_buffer("buf", distgrad.ones(1))
    finally:
        for h in handles:
            h.remove()
    assert seen == [("p", "w"), ("m", "sub"), ("b", "buf")]

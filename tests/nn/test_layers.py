"""Layers against PyTorch (same weights, same inputs) and default initialisations."""
import math

import numpy as np
import pytest

import distgrad
from distgrad import nn
from distgrad.testing.oracle import torch

needs_torch = pytest.mark.skipif(torch is None, reason="torch not installed")


def _copy_params(src, dst):
    with torch.no_grad():
        for (n1, p1), (n2, p2) in zip(src.named_parameters(), dst.named_parameters()):
            assert n1 == n2
            p2.copy_(torch.from_numpy(p1.detach().numpy().copy()))


LAYERS = [
    ("Linear", lambda m: m.Linear(5, 3), (4, 5), "float"),
    ("LinearNoBias", lambda m: m.Linear(5, 3, bias=False), (2, 6, 5), "float"),
    ("ReLU", lambda m: m.ReLU(), (4, 5), "float"),
    ("GELU", lambda m: m.GELU(), (4, 5), "float"),
    ("GELUtanh", lambda m: m.GELU(approximate="tanh"), (4, 5), "float"),
    ("Tanh", lambda m: m.Tanh(), (4, 5), "float"),
    ("Sigmoid", lambda m: m.Sigmoid(), (4, 5), "float"),
    ("LayerNorm", lambda m: m.LayerNorm(5), (4, 5), "float"),
    ("LayerNorm2d", lambda m: m.LayerNorm((3, 5)), (2, 3, 5), "float"),
    ("Embedding", lambda m: m.Embedding(7, 3, padding_idx=0), (4, 2), "index"),
    ("Seq", lambda m: m.Sequential(m.Linear(5, 8), m.GELU(), m.LayerNorm(8), m.Linear(8, 2)),
     (4, 5), "float"),
]


@needs_torch
@pytest.mark.parametrize("name,build,shape,kind", LAYERS, ids=[x[0] for x in LAYERS])
def test_layer_matches_torch(name, build, shape, kind):
    distgrad.manual_seed(0)
    ours = build(nn)
    theirs = build(torch.nn)
    _copy_params(ours, theirs)
    rng = np.random.default_rng(1)
    if kind == "index":
        data = rng.integers(0, 7, shape)
        x, tx = distgrad.tensor(data), torch.tensor(data)
    else:
        data = rng.standard_normal(shape).astype(np.float32)
        x = distgrad.tensor(data, requires_grad=True)
        tx = torch.tensor(data, requires_grad=True)
    out, tout = ours(x), theirs(tx)
    np.testing.assert_allclose(out.detach().numpy(), tout.detach().numpy(), rtol=1e-5, atol=1e-6)
    g = rng.standard_normal(out.shape).astype(np.float32)
    out.backward(distgrad.tensor(g))
    tout.backward(torch.tensor(g))
    if kind == "float":
        np.testing.assert_allclose(x.grad.numpy(), tx.grad.numpy(), rtol=1e-4, atol=1e-5)
    for p, tp in zip(ours.parameters(), theirs.parameters()):
        np.testing.assert_allclose(p.grad.numpy(), tp.grad.numpy(), rtol=1e-4, atol=1e-5)


@needs_torch
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_losses_match_torch(reduction):
    rng = np.random.default_rng(2)
    logits = rng.standard_normal((6, 4)).astype(np.float32)
    target = rng.integers(0, 4, 6)
    pred = rng.standard_normal((6, 4)).astype(np.float32)
    cases = [("CrossEntropyLoss", logits, target, {"label_smoothing": 0.1}),
             ("CrossEntropyLoss", logits, target, {}),
             ("MSELoss", pred, logits, {})]
    for cls, a, b, kw in cases:
        x, tx = distgrad.tensor(a, requires_grad=True), torch.tensor(a, requires_grad=True)
        ours = getattr(nn, cls)(reduction=reduction, **kw)(x, distgrad.tensor(b))
        theirs = getattr(torch.nn, cls)(reduction=reduction, **kw)(tx, torch.tensor(b))
        np.testing.assert_allclose(ours.detach().numpy(), theirs.detach().numpy(), rtol=1e-5)
        ours.sum().backward()
        theirs.sum().backward()
        np.testing.assert_allclose(x.grad.numpy(), tx.grad.numpy(), rtol=1e-5, atol=1e-7)


def test_linear_default_init_bounds():
    distgrad.manual_seed(0)
    lin = nn.Linear(400, 300)
    bound = 1 / math.sqrt(400)  # kaiming_uniform(a=sqrt(5)) gives 1/sqrt(fan_in)
    w, b = lin.weight.detach().numpy(), lin.bias.detach().numpy()
    assert np.abs(w).max() <= bound and np.abs(w).max() > 0.95 * bound
    assert np.abs(b).max() <= bound
    assert abs(w.std() - bound / math.sqrt(3)) < 0.01 * bound
    assert lin.weight.dtype == distgrad.float32


def test_other_default_inits():
    ln = nn.LayerNorm(6)
    assert ln.weight.tolist() == [1.0] * 6 and ln.bias.tolist() == [0.0] * 6
    emb = nn.Embedding(2000, 50, padding_idx=3)
    w = emb.weight.detach().numpy()
    assert abs(w.std() - 1.0) < 0.02 and abs(w.mean()) < 0.02
    assert not w[3].any()


def test_init_functions():
    t = distgrad.empty(300, 200)
    nn.init.xavier_uniform_(t)
    a = math.sqrt(6 / 500)
    assert np.abs(t.numpy()).max() <= a
    nn.init.kaiming_normal_(t, nonlinearity="relu")
    assert abs(t.numpy().std() - math.sqrt(2 / 200)) < 0.005
    nn.init.constant_(t, 0.5)
    assert float(t.mean()) == 0.5
    nn.init.zeros_(t)
    assert not t.numpy().any()
    nn.init.eye_(t)
    assert float(t.sum()) == 200
    nn.init.orthogonal_(t)
    q = t.numpy()
    np.testing.assert_allclose(q.T @ q, np.eye(200), atol=1e-4)
    assert nn.init.calculate_gain("tanh") == 5 / 3


def test_init_does_not_record_graph():
    p = nn.Parameter(distgrad.empty(3, 3))
    nn.init.normal_(p)
    assert p.is_leaf and p.grad_fn is None


def test_clip_grad_norm():
    p1 = nn.Parameter(distgrad.zeros(2))
    p2 = nn.Parameter(distgrad.zeros(2))
    p1.grad = distgrad.tensor([3.0, 0.0])
    p2.grad = distgrad.tensor([0.0, 4.0])
    norm = nn.utils.clip_grad_norm_([p1, p2], max_norm=1.0)
    assert abs(norm.item() - 5.0) < 1e-6
    np.testing.assert_allclose(p1.grad.numpy(), [0.6, 0.0], rtol=1e-5)
    np.testing.assert_allclose(p2.grad.numpy(), [0.0, 0.8], rtol=1e-5)
    norm = nn.utils.clip_grad_norm_([p1, p2], max_norm=10.0, norm_type="inf")
    assert abs(norm.item() - 0.8) < 1e-6
    np.testing.assert_allclose(p2.grad.numpy(), [0.0, 0.8], rtol=1e-5)  # under the max: unchanged
    p1.grad = distgrad.tensor([float("inf"), 0.0])
    with pytest.raises(RuntimeError, match="non-finite"):
        nn.utils.clip_grad_norm_(p1, 1.0, error_if_nonfinite=True)


@needs_torch
def test_clip_grad_norm_matches_torch():
    rng = np.random.default_rng(3)
    grads = [rng.standard_normal(s).astype(np.float32) for s in [(3, 4), (4,), (2, 2)]]
    ours = [nn.Parameter(distgrad.zeros(*g.shape)) for g in grads]
    theirs = [torch.nn.Parameter(torch.zeros(*g.shape)) for g in grads]
    for p, tp, g in zip(ours, theirs, grads):
        p.grad = distgrad.tensor(g)
        tp.grad = torch.tensor(g)
    for norm_type in (2.0, 1.0, float("inf")):
        n1 = nn.utils.clip_grad_norm_(ours, 0.5, norm_type=norm_type)
        n2 = torch.nn.utils.clip_grad_norm_(theirs, 0.5, norm_type=norm_type)
        assert abs(n1.item() - n2.item()) < 1e-5
        for p, tp in zip(ours, theirs):
            np.testing.assert_allclose(p.grad.numpy(), tp.grad.numpy(), rtol=1e-5, atol=1e-7)

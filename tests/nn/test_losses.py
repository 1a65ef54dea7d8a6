"""Losses and distances against PyTorch, as functions and as modules, for every reduction:
values, gradients of input and target, module buffers and argument errors."""
import warnings

import numpy as np
import pytest

import distgrad
from distgrad import nn
from distgrad.testing.oracle import check_op, torch

pytestmark = pytest.mark.timeout(60)
needs_torch = pytest.mark.skipif(torch is None, reason="torch not installed")

REDUCTIONS = ["mean", "sum", "none"]
RNG = np.random.default_rng(0)
PROBS = RNG.uniform(0.05, 0.95, (4, 3))
TARGET01 = RNG.uniform(0, 1, (4, 3))
WEIGHT = RNG.uniform(0.5, 2, (4, 3))


def _log_probs(shape, seed):
    x = np.random.default_rng(seed).standard_normal(shape)
    return x - np.log(np.exp(x).sum(-1, keepdims=True))


# (name, fn(lib, *inputs), input arrays or shapes, which inputs get a gradient)
FUNCTIONAL = {
    "smooth_l1": (lambda m, r, x, y: m.nn.functional.smooth_l1_loss(x, y, reduction=r),
                  [(4, 3), (4, 3)], None),
    "smooth_l1_beta": (lambda m, r, x, y: m.nn.functional.smooth_l1_loss(x, y, reduction=r,
                                                                         beta=0.4),
                       [(4, 3), (4, 3)], None),
    "smooth_l1_beta0": (lambda m, r, x, y: m.nn.functional.smooth_l1_loss(x, y, reduction=r,
                                                                          beta=0.0),
                        [(4, 3), (4, 3)], None),
    "huber": (lambda m, r, x, y: m.nn.functional.huber_loss(x, y, reduction=r), [(4, 3), (4, 3)],
              None),
    "huber_delta_weight": (lambda m, r, x, y, w: m.nn.functional.huber_loss(
        x, y, reduction=r, delta=0.7, weight=w), [(4, 3), (4, 3), WEIGHT], [True, True, False]),
    "mse_weight": (lambda m, r, x, y, w: m.nn.functional.mse_loss(x, y, reduction=r, weight=w),
                   [(4, 3), (4, 3), WEIGHT], [True, True, False]),
    "l1_weight": (lambda m, r, x, y, w: m.nn.functional.l1_loss(x, y, reduction=r, weight=w),
                  [(4, 3), (4, 3), WEIGHT], [True, True, False]),
    "bce": (lambda m, r, p, t: m.nn.functional.binary_cross_entropy(p, t, reduction=r),
            [PROBS, TARGET01], None),
    "bce_weight": (lambda m, r, p, t, w: m.nn.functional.binary_cross_entropy(
        p, t, weight=w, reduction=r), [PROBS, TARGET01, WEIGHT[0]], [True, True, False]),
    "bce_logits": (lambda m, r, x, t: m.nn.functional.binary_cross_entropy_with_logits(
        x, t, reduction=r), [(4, 3), TARGET01], None),
    "bce_logits_weights": (
        lambda m, r, x, t, w, pw: m.nn.functional.binary_cross_entropy_with_logits(
            x, t, weight=w, pos_weight=pw, reduction=r),
        [(4, 3), TARGET01, WEIGHT, WEIGHT[0] * 1.5], [True, True, False, False]),
    "kl_div_batchmean": (lambda m, r, x, t: m.nn.functional.kl_div(
        x, t, reduction="batchmean" if r == "mean" else r), [_log_probs((4, 3), 1),
                                                              np.exp(_log_probs((4, 3), 2))], None),
    "kl_div_log_target": (lambda m, r, x, t: m.nn.functional.kl_div(
        x, t, reduction=r if r != "mean" else "batchmean", log_target=True),
        [_log_probs((4, 3), 3), _log_probs((4, 3), 4)], None),
}


@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("name", list(FUNCTIONAL), ids=list(FUNCTIONAL))
def test_functional_losses(name, reduction):
    fn, inputs, grads = FUNCTIONAL[name]
    check_op(lambda m, *xs: fn(m, reduction, *xs), inputs, requires_grad=grads)


@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_kl_div_mean_warns_and_matches(reduction):
    x, t = _log_probs((4, 3), 5), np.exp(_log_probs((4, 3), 6))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        check_op(lambda m, a, b: m.nn.functional.kl_div(a, b, reduction=reduction), [x, t])
    said = [str(w.message) for w in caught if "batchmean" in str(w.message)]
    assert bool(said) == (reduction == "mean")


def test_kl_div_zero_target_is_zero_loss():
    x = distgrad.tensor([[-1.0, -2.0]], requires_grad=True)
    t = distgrad.tensor([[0.0, 1.0]], requires_grad=True)
    loss = distgrad.nn.functional.kl_div(x, t, reduction="sum")
    assert loss.item() == pytest.approx(2.0)
    loss.backward()
    assert np.isfinite(t.grad.numpy()).all() and np.isfinite(x.grad.numpy()).all()


@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("case", ["weight", "ignore_index", "label_smoothing", "ls_weight_ignore",
                                  "k_dim", "probs", "probs_ls_weight", "unbatched"])
def test_cross_entropy_and_nll_extras(case, reduction):
    rng = np.random.default_rng(7)
    logits = rng.standard_normal((5, 4))
    target = np.array([0, 3, 1, 1, 2])
    w = rng.uniform(0.5, 2, 4)
    kw, t = {}, target
    if case in ("weight", "ls_weight_ignore", "probs_ls_weight"):
        kw["weight"] = w
    if case in ("ignore_index", "ls_weight_ignore"):
        kw["ignore_index"] = 1
    if case in ("label_smoothing", "ls_weight_ignore", "probs_ls_weight"):
        kw["label_smoothing"] = 0.2
    if case == "k_dim":
        logits = rng.standard_normal((2, 4, 3, 2))
        t = rng.integers(0, 4, (2, 3, 2))
    if case.startswith("probs"):
        t = np.exp(_log_probs((5, 4), 8))
    if case == "unbatched":
        logits, t = logits[0], np.array(2)

    def fn(m, x):
        extra = {k: m.tensor(v) if isinstance(v, np.ndarray) else v for k, v in kw.items()}
        loss = m.nn.CrossEntropyLoss(reduction=reduction, **extra)(x, m.tensor(t))
        if "label_smoothing" in extra or case.startswith("probs"):
            return loss
        nll = m.nn.NLLLoss(reduction=reduction, **extra)(m.log_softmax(x, dim=0 if x.ndim == 1
                                                                        else 1), m.tensor(t))
        return loss, nll
    check_op(fn, [logits])


@needs_torch
@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_cross_entropy_is_two_nodes_as_in_pytorch_and_twice_differentiable(reduction):
    rng = np.random.default_rng(3)
    x, t, w = rng.standard_normal((5, 3)), np.array([0, 2, 1, -100, 2]), rng.uniform(0.5, 2, 3)
    grads = []
    for m in (distgrad, torch):
        a = m.tensor(x, requires_grad=True)
        loss = m.nn.functional.cross_entropy(a, m.tensor(t), weight=m.tensor(w),
                                             reduction=reduction)
        names = [type(loss.grad_fn).__name__, type(loss.grad_fn.next_functions[0][0]).__name__]
        assert names == ["NllLossBackward0", "LogSoftmaxBackward0"]
        g, = m.autograd.grad(loss.sum(), a, create_graph=True)
        gg, = m.autograd.grad((g * g).sum(), a)
        grads.append((loss.detach().numpy(), g.detach().numpy(), gg.numpy()))
    for ours, theirs in zip(*grads):
        np.testing.assert_allclose(ours, theirs, rtol=1e-10, atol=1e-12)


def test_cross_entropy_errors():
    x = distgrad.randn(3, 4)
    with pytest.raises(RuntimeError, match="label_smoothing must be between 0.0 and 1.0"):
        distgrad.nn.functional.cross_entropy(x, distgrad.tensor([0, 1, 2]), label_smoothing=1.5)


@pytest.mark.parametrize("shapes,dim", [([(4, 5), (4, 5)], 1), ([(3, 4), (1, 4)], 1),
                                        ([(2, 3, 4), (2, 3, 4)], -1), ([(5,), (5,)], 0)])
def test_cosine_similarity(shapes, dim):
    check_op(lambda m, a, b: m.nn.functional.cosine_similarity(a, b, dim=dim), shapes)
    check_op(lambda m, a, b: m.nn.CosineSimilarity(dim=dim, eps=1e-6)(a, b), shapes)


@needs_torch
def test_cosine_similarity_clamps_small_norms_like_torch():
    tiny = np.array([[1e-9, -2e-9, 0.5e-9], [1.0, 2.0, 3.0]])
    other = np.array([[1.0, 0.5, -1.0], [3.0, 1.0, 2.0]])
    check_op(lambda m, a, b: m.nn.functional.cosine_similarity(a, b), [tiny, other])


@pytest.mark.parametrize("shapes,kw", [([(4, 5), (4, 5)], {}), ([(3, 4), (1, 4)], {"p": 1.0}),
                                       ([(2, 3, 4), (2, 3, 4)], {"keepdim": True}),
                                       ([(5,), (5,)], {"p": 3.0, "eps": 1e-3}),
                                       ([(4, 5), (4, 5)], {"p": float("inf")})])
def test_pairwise_distance(shapes, kw):
    check_op(lambda m, a, b: m.nn.functional.pairwise_distance(a, b, **kw), shapes)
    check_op(lambda m, a, b: m.nn.PairwiseDistance(**kw)(a, b), shapes)


MODULES = {
    "SmoothL1Loss": ({"beta": 0.5}, [(4, 3), (4, 3)]),
    "HuberLoss": ({"delta": 0.5}, [(4, 3), (4, 3)]),
    "BCELoss": ({}, [PROBS, TARGET01]),
    "BCEWithLogitsLoss": ({}, [(4, 3), TARGET01]),
    "KLDivLoss": ({"log_target": True}, [_log_probs((4, 3), 9), _log_probs((4, 3), 10)]),
}


@pytest.mark.parametrize("reduction", ["sum", "none"])
@pytest.mark.parametrize("name", list(MODULES), ids=list(MODULES))
def test_loss_modules(name, reduction):
    kw, inputs = MODULES[name]
    check_op(lambda m, x, t: getattr(m.nn, name)(reduction=reduction, **kw)(x, t), inputs)


@needs_torch
def test_weighted_loss_modules_match_torch():
    w, pw = WEIGHT[0], WEIGHT[0] * 2
    check_op(lambda m, x, t: m.nn.BCELoss(weight=m.tensor(w))(x, t), [PROBS, TARGET01])
    check_op(lambda m, x, t: m.nn.BCEWithLogitsLoss(weight=m.tensor(w), pos_weight=m.tensor(pw))(
        x, t), [(4, 3), TARGET01])
    for name, kw in [("BCEWithLogitsLoss", {"weight": w, "pos_weight": pw}),
                     ("BCELoss", {"weight": w}), ("BCEWithLogitsLoss", {}),
                     ("SmoothL1Loss", {}), ("KLDivLoss", {}), ("CrossEntropyLoss", {"weight": w})]:
        ours = getattr(nn, name)(**{k: distgrad.tensor(v) for k, v in kw.items()})
        theirs = getattr(torch.nn, name)(**{k: torch.tensor(v) for k, v in kw.items()})
        assert list(ours.state_dict()) == list(theirs.state_dict()), name
        assert [n for n, _ in ours.named_buffers()] == [n for n, _ in theirs.named_buffers()]


@needs_torch
def test_legacy_size_average_and_reduce():
    for kw in ({"size_average": False}, {"reduce": False}, {"size_average": True, "reduce": True}):
        check_op(lambda m, x, t: m.nn.SmoothL1Loss(**kw)(x, t), [(4, 3), (4, 3)])
        check_op(lambda m, x, t: m.nn.functional.kl_div(x, t, **kw),
                 [_log_probs((4, 3), 11), np.exp(_log_probs((4, 3), 12))])


def test_loss_argument_errors():
    x = distgrad.rand(3, 4)
    F = distgrad.nn.functional
    with pytest.raises(RuntimeError, match="smooth_l1_loss does not support negative values"):
        F.smooth_l1_loss(x, x, beta=-1)
    with pytest.raises(RuntimeError, match="huber_loss does not support non-positive values"):
        F.huber_loss(x, x, delta=0)
    with pytest.raises(ValueError, match="bogus is not a valid value for reduction"):
        F.smooth_l1_loss(x, x, reduction="bogus")
    with pytest.raises(ValueError, match="bogus is not a valid value for reduction"):
        F.kl_div(x, x, reduction="bogus")
    with pytest.raises(ValueError, match="that is different to the input size"):
        F.binary_cross_entropy(x, distgrad.rand(3))
    with pytest.raises(RuntimeError, match="all elements of input should be between 0 and 1"):
        F.binary_cross_entropy(x * 3 - 1, x)
    with pytest.raises(ValueError, match="must be the same as input size"):
        F.binary_cross_entropy_with_logits(x, distgrad.rand(3))
    with pytest.raises(ValueError, match="Weights and input must have the same size"):
        F.mse_loss(x, x, weight=distgrad.ones(4))
    with pytest.warns(UserWarning, match="different to the input size"):
        F.huber_loss(x, distgrad.rand(4))

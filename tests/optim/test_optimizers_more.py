"""Adadelta, Adagrad, RMSprop, Adamax, NAdam, RAdam and LBFGS against PyTorch: parameters
after several steps, state-dict layout and round trips, argument errors."""
import copy

import numpy as np
import pytest

import distgrad
from distgrad import nn, optim
from distgrad.testing.oracle import torch

pytestmark = pytest.mark.timeout(60)
needs_torch = pytest.mark.skipif(torch is None, reason="PyTorch (the oracle) is not installed")

CONFIGS = [
    ("Adadelta", {}),
    ("Adadelta", {"lr": 0.5, "rho": 0.8, "eps": 1e-5, "weight_decay": 0.1, "maximize": True}),
    ("Adagrad", {}),
    ("Adagrad", {"lr": 0.1, "lr_decay": 0.01, "initial_accumulator_value": 0.1,
                 "weight_decay": 0.05, "foreach": False}),
    ("RMSprop", {}),
    ("RMSprop", {"lr": 0.01, "alpha": 0.9, "momentum": 0.8}),
    ("RMSprop", {"lr": 0.01, "alpha": 0.3, "centered": True, "momentum": 0.9,
                 "weight_decay": 0.01}),
    ("Adamax", {"lr": 0.05}),
    ("Adamax", {"lr": 0.05, "betas": (0.8, 0.99), "weight_decay": 0.1, "maximize": True}),
    ("NAdam", {"lr": 0.05}),
    ("NAdam", {"lr": 0.05, "weight_decay": 0.1, "momentum_decay": 0.01}),
    ("NAdam", {"lr": 0.05, "weight_decay": 0.1, "decoupled_weight_decay": True}),
    ("RAdam", {"lr": 0.05}),
    ("RAdam", {"lr": 0.05, "weight_decay": 0.1}),
    ("RAdam", {"lr": 0.05, "weight_decay": 0.1, "decoupled_weight_decay": True}),
]


def _problem(lib, dtype):
    rng = np.random.default_rng(0)
    x = lib.tensor(rng.standard_normal((8, 3)).astype(dtype))
    y = lib.tensor(rng.standard_normal((8, 4)).astype(dtype))
    w = lib.nn.Parameter(lib.tensor(rng.standard_normal((4, 3)).astype(dtype)))
    b = lib.nn.Parameter(lib.tensor(rng.standard_normal(4).astype(dtype)))
    return x, y, w, b


def _train(lib, name, kwargs, steps=10, dtype="float32"):
    x, y, w, b = _problem(lib, dtype)
    lr = kwargs.get("lr", 0.01)
    opt = getattr(lib.optim, name)([{"params": [w]}, {"params": [b], "lr": lr / 2}], **kwargs)
    for _ in range(steps):
        opt.zero_grad()
        ((lib.nn.functional.linear(x, w, b).tanh() - y) ** 2).mean().backward()
        opt.step()
    return w.detach().numpy().copy(), b.detach().numpy().copy(), opt


@needs_torch
@pytest.mark.parametrize("name,kwargs", CONFIGS, ids=str)
def test_matches_torch(name, kwargs):
    for dtype, rtol in (("float32", 1e-5), ("float64", 1e-12)):
        w, b, ours = _train(distgrad, name, kwargs, dtype=dtype)
        tw, tb, theirs = _train(torch, name, kwargs, dtype=dtype)
        np.testing.assert_allclose(w, tw, rtol=rtol, atol=rtol)
        np.testing.assert_allclose(b, tb, rtol=rtol, atol=rtol)
        a, t = ours.state_dict(), theirs.state_dict()
        assert a["param_groups"] == [{k: v for k, v in g.items()} for g in t["param_groups"]]
        assert {k: sorted(v) for k, v in a["state"].items()} == \
            {k: sorted(v) for k, v in t["state"].items()}
        for k, v in a["state"].items():
            for key, value in v.items():
                np.testing.assert_allclose(value.numpy(), t["state"][k][key].numpy(),
                                           rtol=rtol * 10, atol=rtol, err_msg=key)


@pytest.mark.parametrize("name,kwargs", CONFIGS[::2], ids=str)
def test_state_dict_round_trip_continues_identically(name, kwargs):
    _, _, opt = _train(distgrad, name, kwargs, steps=3)
    params = [p for g in opt.param_groups for p in g["params"]]
    clones = [nn.Parameter(p.detach().clone()) for p in params]
    other = getattr(optim, name)([{"params": [clones[0]]}, {"params": [clones[1]]}], **kwargs)
    other.load_state_dict(copy.deepcopy(opt.state_dict()))
    assert other.param_groups[1]["lr"] == opt.param_groups[1]["lr"]
    for _ in range(2):
        for p, c in zip(params, clones):
            p.grad = distgrad.ones(*p.shape)
            c.grad = distgrad.ones(*p.shape)
        opt.step()
        other.step()
    for p, c in zip(params, clones):
        np.testing.assert_array_equal(p.detach().numpy(), c.detach().numpy())


def test_adagrad_state_exists_before_the_first_step():
    p = nn.Parameter(distgrad.zeros(3))
    sd = optim.Adagrad([p], initial_accumulator_value=0.5).state_dict()
    assert sorted(sd["state"][0]) == ["step", "sum"]
    assert sd["state"][0]["sum"].tolist() == [0.5] * 3 and sd["state"][0]["step"].item() == 0


@pytest.mark.parametrize("name,kwargs,message", [
    ("Adadelta", {"rho": 1.5}, "Invalid rho value: 1.5"),
    ("Adadelta", {"lr": -1}, "Invalid learning rate: -1"),
    ("Adagrad", {"lr_decay": -0.1}, "Invalid lr_decay value: -0.1"),
    ("Adagrad", {"initial_accumulator_value": -1},
     "Invalid initial_accumulator_value value: -1"),
    ("RMSprop", {"alpha": -0.5}, "Invalid alpha value: -0.5"),
    ("RMSprop", {"momentum": -0.5}, "Invalid momentum value: -0.5"),
    ("Adamax", {"betas": (0.9, 1.0)}, "Invalid beta parameter at index 1: 1.0"),
    ("NAdam", {"momentum_decay": -1}, "Invalid momentum_decay value: -1"),
    ("RAdam", {"eps": -1}, "Invalid epsilon value: -1"),
    ("RAdam", {"weight_decay": -1}, "Invalid weight_decay value: -1"),
])
def test_bad_arguments(name, kwargs, message):
    p = nn.Parameter(distgrad.ones(1))
    with pytest.raises(ValueError, match=message):
        getattr(optim, name)([p], **kwargs)
    if torch is not None:
        with pytest.raises(ValueError, match=message):
            getattr(torch.optim, name)([torch.nn.Parameter(torch.ones(1))], **kwargs)


@pytest.mark.parametrize("name", ["Adadelta", "Adagrad", "RMSprop", "Adamax", "NAdam", "RAdam"])
def test_params_without_grad_are_left_alone(name):
    used, unused = nn.Parameter(distgrad.ones(2)), nn.Parameter(distgrad.ones(2))
    opt = getattr(optim, name)([used, unused])
    used.grad = distgrad.ones(2)
    opt.step()
    assert unused.tolist() == [1.0, 1.0] and used.tolist() != [1.0, 1.0]
    assert unused not in opt.state or name == "Adagrad"  # Adagrad's state exists from the start


# -- LBFGS --

def _lbfgs_run(lib, kwargs, steps, dtype, problem):
    rng = np.random.default_rng(0)
    if problem == "regression":
        a = lib.tensor(rng.standard_normal((20, 5)).astype(dtype))
        y = lib.tensor(rng.standard_normal(20).astype(dtype))
        w = lib.nn.Parameter(lib.zeros(5, dtype=getattr(lib, dtype)))
        b = lib.nn.Parameter(lib.zeros(1, dtype=getattr(lib, dtype)))

        def objective():
            return ((a @ w + b - y) ** 2).mean() + 0.1 * (w ** 4).sum()
    elif problem == "wavy":  # non-convex: negative curvature, so some pairs are skipped
        w = lib.nn.Parameter(lib.tensor([0.3, -1.2, 2.0], dtype=getattr(lib, dtype)))
        b = lib.nn.Parameter(lib.tensor([0.7], dtype=getattr(lib, dtype)))

        def objective():
            return (lib.sin(3 * w) + 0.05 * w ** 2).sum() + (lib.cos(2 * b) * b).sum()
    elif problem == "sine":  # one bumpy dimension: the zoom's safeguard moves trial points
        w = lib.nn.Parameter(lib.tensor([0.3], dtype=getattr(lib, dtype)))
        b = lib.nn.Parameter(lib.tensor([0.0], dtype=getattr(lib, dtype)))

        def objective():
            return (lib.sin(5 * w) + 0.01 * w ** 2).sum() + (b ** 2).sum()
    else:  # Rosenbrock, a classic with a curved valley
        w = lib.nn.Parameter(lib.tensor([-1.5, 2.0], dtype=getattr(lib, dtype)))
        b = lib.nn.Parameter(lib.tensor([0.5], dtype=getattr(lib, dtype)))

        def objective():
            return (1 - w[0]) ** 2 + 100 * (w[1] - w[0] ** 2) ** 2 + (b ** 2).sum()
    opt = lib.optim.LBFGS([w, b], **kwargs)
    calls = []

    def closure():
        opt.zero_grad()
        loss = objective()
        loss.backward()
        calls.append(1)
        return loss
    losses = [opt.step(closure).item() for _ in range(steps)]
    return np.concatenate([w.detach().numpy(), b.detach().numpy()]), losses, len(calls), opt


LBFGS_CONFIGS = [
    ({}, "regression"),
    ({"line_search_fn": "strong_wolfe"}, "regression"),
    ({"history_size": 2, "max_iter": 7, "lr": 0.5}, "regression"),
    ({"history_size": 3, "line_search_fn": "strong_wolfe", "max_iter": 12}, "rosenbrock"),
    ({"lr": 0.01, "max_iter": 5, "max_eval": 4, "tolerance_change": 1e-12}, "rosenbrock"),
    # line-search paths: long extrapolation from a tiny first step, zoom of a huge bracket,
    # running out of evaluations inside the search, non-convex curvature
    ({"line_search_fn": "strong_wolfe", "lr": 1e-4, "max_iter": 10}, "rosenbrock"),
    ({"line_search_fn": "strong_wolfe", "lr": 300.0, "max_iter": 10}, "rosenbrock"),
    ({"line_search_fn": "strong_wolfe", "max_iter": 10, "max_eval": 7}, "rosenbrock"),
    ({"line_search_fn": "strong_wolfe", "max_iter": 15, "history_size": 4}, "wavy"),
    ({"line_search_fn": "strong_wolfe", "lr": 40.0, "max_iter": 15}, "wavy"),
    ({"max_iter": 15, "lr": 0.3}, "wavy"),
    ({"line_search_fn": "strong_wolfe", "lr": 100.0, "max_iter": 10}, "sine"),
    ({"line_search_fn": "strong_wolfe", "tolerance_change": 0.01}, "rosenbrock"),
    ({"tolerance_grad": 1e3}, "regression"),  # optimal at the start: one evaluation, no step
]


@needs_torch
@pytest.mark.parametrize("kwargs,problem", LBFGS_CONFIGS, ids=str)
def test_lbfgs_matches_torch(kwargs, problem):
    """Same iterates, losses and closure evaluations (float64: the two libraries round
    differently in float32, and L-BFGS amplifies rounding once it has converged)."""
    x, losses, calls, ours = _lbfgs_run(distgrad, kwargs, 3, "float64", problem)
    tx, tlosses, tcalls, theirs = _lbfgs_run(torch, kwargs, 3, "float64", problem)
    np.testing.assert_allclose(x, tx, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(losses, tlosses, rtol=1e-9)
    assert calls == tcalls
    a, t = ours.state_dict(), theirs.state_dict()
    assert a["param_groups"] == t["param_groups"]
    assert sorted(a["state"]) == sorted(t["state"]) == [0]
    sa, st = a["state"][0], t["state"][0]
    assert sorted(sa) == sorted(st)
    assert (sa["func_evals"], sa["n_iter"]) == (st["func_evals"], st["n_iter"])
    if "d" in st:  # absent when the start point already met tolerance_grad
        assert len(sa["old_dirs"]) == len(st["old_dirs"])
        np.testing.assert_allclose(sa["d"].numpy(), st["d"].numpy(), rtol=1e-8, atol=1e-12)
        np.testing.assert_allclose(float(sa["t"]), float(st["t"]), rtol=1e-9)
    # float32 agrees before rounding differences can grow
    x32, _, _, _ = _lbfgs_run(distgrad, dict(kwargs, max_iter=3), 1, "float32", problem)
    tx32, _, _, _ = _lbfgs_run(torch, dict(kwargs, max_iter=3), 1, "float32", problem)
    np.testing.assert_allclose(x32, tx32, rtol=1e-5, atol=1e-6)


def _line_problem(kind, seed):
    """A loss on R^2 with its gradient, a start point: "kink" is |x - a| smoothed so little
    that only a sliver of the line meets the curvature condition (the zoom runs until its
    interval is too narrow); "bumps" is a sum of sines on a bowl."""
    rng = np.random.default_rng(seed)
    a, k = rng.uniform(0.05, 1.5), float(rng.choice([1.0, 3.0, 10.0]))
    if kind == "kink":
        def loss_and_grad(x):
            r = np.sqrt((x - a) ** 2 + 1e-20)
            return float(r.sum()), (x - a) / r
        return loss_and_grad, np.zeros(2)

    def loss_and_grad(x):
        return float(np.sin(k * x).sum() + 0.5 * (x ** 2).sum()), k * np.cos(k * x) + x
    return loss_and_grad, rng.standard_normal(2)


@needs_torch
@pytest.mark.parametrize("kind", ["kink", "bumps"])
@pytest.mark.parametrize("seed", range(12))
@pytest.mark.parametrize("t", [0.01, 1.0, 5.0, 40.0])
def test_line_search_decides_as_torch(kind, seed, t):
    """The strong-Wolfe search alone, against PyTorch's on the same line: the same
    accepted step, loss and number of evaluations, also when it stops on a narrow
    interval or moves a trial point off an end."""
    import importlib
    _strong_wolfe = getattr(importlib.import_module("torch.optim.lbfgs"), "_strong_wolfe",
                            None)  # private to PyTorch: it may move
    if _strong_wolfe is None:
        pytest.skip("this PyTorch has no torch.optim.lbfgs._strong_wolfe to compare with")
    from distgrad.optim.lbfgs import _Probe, _WolfeSearch
    loss_and_grad, x0 = _line_problem(kind, seed)
    f0, g0 = loss_and_grad(x0)
    d = -g0

    def probe(step):
        f, g = loss_and_grad(x0 + step * d)
        return _Probe(step, f, g, g.dot(d))
    with np.errstate(divide="ignore", invalid="ignore"):
        search = _WolfeSearch(probe, _Probe(0, f0, g0, g0.dot(d)), np.abs(d).max(), 25)
        best = search.run(t)

    def torch_probe(x, step, direction):
        f, g = loss_and_grad(x0 + float(step) * d)
        return f, torch.tensor(g)
    tg, td = torch.tensor(g0), torch.tensor(d)
    f, _, step, evals = _strong_wolfe(torch_probe, None, t, td, f0, tg, tg.dot(td), max_ls=25)
    assert search.evaluations == evals
    np.testing.assert_allclose([best.step, best.loss], [float(step), float(f)], rtol=1e-12)


def test_lbfgs_converges_and_round_trips():
    x, losses, _, opt = _lbfgs_run(distgrad, {"line_search_fn": "strong_wolfe", "max_iter": 50},
                                   2, "float64", "rosenbrock")
    np.testing.assert_allclose(x, [1.0, 1.0, 0.0], atol=1e-4)
    sd = copy.deepcopy(opt.state_dict())
    w, b = (nn.Parameter(p.detach().clone()) for p in opt.param_groups[0]["params"])
    other = optim.LBFGS([w, b], line_search_fn="strong_wolfe", max_iter=50)
    other.load_state_dict(sd)
    assert other.state[w]["n_iter"] == opt.state[opt._params[0]]["n_iter"]
    assert isinstance(other.state[w]["d"], distgrad.Tensor)


def test_lbfgs_needs_a_closure_and_one_group():
    p = nn.Parameter(distgrad.ones(2))
    opt = optim.LBFGS([p])
    with pytest.raises(TypeError):
        opt.step()
    with pytest.raises(ValueError, match="doesn't support per-parameter options"):
        optim.LBFGS([{"params": [p]}, {"params": [nn.Parameter(distgrad.ones(1))]}])
    with pytest.raises(RuntimeError, match="only 'strong_wolfe' is supported"):
        def closure():
            opt.zero_grad()
            loss = (p * p).sum()
            loss.backward()
            return loss
        optim.LBFGS([p], line_search_fn="armijo").step(closure)


def test_lbfgs_runs_step_hooks_and_bumps_versions():
    p = nn.Parameter(distgrad.tensor([2.0, -1.0]))
    opt = optim.LBFGS([p], max_iter=2)
    events = []
    opt.register_step_pre_hook(lambda o, a, k: events.append("pre"))
    opt.register_step_post_hook(lambda o, a, k: events.append("post"))
    saved = (p * p).sum()

    def closure():
        opt.zero_grad()
        loss = ((p - 1) ** 2).sum()
        loss.backward()
        return loss
    opt.step(closure)
    assert events == ["pre", "post"]
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        saved.backward()


def _signature(fn):
    import inspect
    return [(p.name, p.kind, repr(p.default)) for p in inspect.signature(fn).parameters.values()]


@needs_torch
@pytest.mark.parametrize("name", ["SGD", "Adam", "AdamW", "Adadelta", "Adagrad", "RMSprop",
                                  "Adamax", "NAdam", "RAdam", "LBFGS"])
def test_signatures_match_torch(name):
    ours, theirs = getattr(optim, name), getattr(torch.optim, name)
    assert _signature(ours.__init__) == _signature(theirs.__init__)
    assert _signature(ours.step) == _signature(theirs.step)


@needs_torch
@pytest.mark.parametrize("name", ["Adam", "AdamW", "Adamax", "NAdam", "RAdam", "Adagrad",
                                  "Adadelta", "RMSprop"])
def test_0d_state_stays_a_0d_float32_tensor_as_in_torch(name):
    # NumPy turns 0-d array + scalar into a scalar; a counter must stay an array
    # (np.asarray(tensor), the codec and load_state_dict all need one)
    (_, _, ours), (_, _, theirs) = (_train(lib, name, {"lr": 0.01}, steps=3)
                                    for lib in (distgrad, torch))
    for i, state in ours.state_dict()["state"].items():
        for key, value in state.items():
            expected = theirs.state_dict()["state"][i][key]
            if expected.dim() == 0:
                a = np.asarray(value)
                assert type(a) is np.ndarray and a.shape == () and a.dtype == np.float32, key
                assert float(a) == pytest.approx(float(expected), rel=1e-6), key

"""Learning-rate schedulers: the same schedule in PyTorch and distgrad for 100 steps, every lr
(and momentum / beta1 where cycled) equal to 1e-12 relative; state dicts, warnings, errors."""
import copy
import warnings

import numpy as np
import pytest

import distgrad
from distgrad import nn, optim
from distgrad.optim import lr_scheduler
from distgrad.testing.oracle import torch

pytestmark = pytest.mark.timeout(60)
needs_torch = pytest.mark.skipif(torch is None, reason="PyTorch (the oracle) is not installed")


class _Decay:
    """A callable object: LambdaLR saves its __dict__ in the state dict."""

    def __init__(self, rate):
        self.rate = rate

    def __call__(self, epoch):
        return self.rate ** epoch


SCHEDULES = {
    "StepLR": ("SGD", {}, lambda m, o: m.StepLR(o, 7, gamma=0.3)),
    "MultiStepLR": ("SGD", {}, lambda m, o: m.MultiStepLR(o, [10, 30, 30, 60], gamma=0.5)),
    "ExponentialLR": ("SGD", {}, lambda m, o: m.ExponentialLR(o, 0.97)),
    "CosineAnnealingLR": ("SGD", {}, lambda m, o: m.CosineAnnealingLR(o, T_max=17,
                                                                       eta_min=0.001)),
    "LambdaLR": ("SGD", {}, lambda m, o: m.LambdaLR(o, lambda e: 0.95 ** e)),
    "LambdaLR_per_group": ("SGD", {}, lambda m, o: m.LambdaLR(o, [_Decay(0.9),
                                                                  lambda e: 1 / (e + 1)])),
    "MultiplicativeLR": ("SGD", {}, lambda m, o: m.MultiplicativeLR(o, lambda e: 0.98)),
    "LinearLR": ("SGD", {}, lambda m, o: m.LinearLR(o, start_factor=0.1, end_factor=0.9,
                                                     total_iters=30)),
    "ConstantLR": ("SGD", {}, lambda m, o: m.ConstantLR(o, factor=0.25, total_iters=20)),
    "PolynomialLR": ("SGD", {}, lambda m, o: m.PolynomialLR(o, total_iters=60, power=2.0)),
    "SequentialLR": ("SGD", {}, lambda m, o: m.SequentialLR(
        o, [m.LinearLR(o, 0.1, total_iters=10), m.CosineAnnealingLR(o, 40),
            m.ExponentialLR(o, 0.9)], milestones=[10, 50])),
    "ChainedScheduler": ("SGD", {}, lambda m, o: m.ChainedScheduler(
        [m.ConstantLR(o, 0.5, total_iters=10), m.ExponentialLR(o, 0.97)])),
    "CosineAnnealingWarmRestarts": ("SGD", {}, lambda m, o: m.CosineAnnealingWarmRestarts(
        o, T_0=5, T_mult=2, eta_min=1e-4)),
    "OneCycleLR_cos_sgd": ("SGD", {"momentum": 0.9}, lambda m, o: m.OneCycleLR(
        o, max_lr=1.0, total_steps=100)),
    "OneCycleLR_linear_three_phase_adam": ("Adam", {}, lambda m, o: m.OneCycleLR(
        o, max_lr=[1.0, 0.5], epochs=10, steps_per_epoch=10, anneal_strategy="linear",
        three_phase=True, pct_start=0.25, div_factor=10.0)),
    "OneCycleLR_no_momentum": ("Adagrad", {}, lambda m, o: m.OneCycleLR(
        o, max_lr=0.3, total_steps=100, cycle_momentum=False)),
    "CyclicLR_triangular": ("SGD", {"momentum": 0.9}, lambda m, o: m.CyclicLR(
        o, 0.01, 0.1, step_size_up=10)),
    "CyclicLR_triangular2": ("SGD", {"momentum": 0.9}, lambda m, o: m.CyclicLR(
        o, 0.01, 0.1, step_size_up=7, step_size_down=5, mode="triangular2")),
    "CyclicLR_exp_range_adam": ("Adam", {}, lambda m, o: m.CyclicLR(
        o, [0.01, 0.02], 0.1, step_size_up=6, mode="exp_range", gamma=0.99)),
    "CyclicLR_custom_scale": ("SGD", {}, lambda m, o: m.CyclicLR(
        o, 0.01, 0.1, step_size_up=4, scale_fn=lambda x: 0.5 ** x, scale_mode="iterations",
        cycle_momentum=False)),
}


def _run(lib, opt_name, opt_kwargs, make, steps=100, metric=None):
    p, q = lib.nn.Parameter(lib.zeros(2)), lib.nn.Parameter(lib.zeros(2))
    opt = getattr(lib.optim, opt_name)([{"params": [p]}, {"params": [q], "lr": 0.05}], lr=0.1,
                                       **opt_kwargs)
    sched = make(lib.optim.lr_scheduler, opt)
    lrs, momenta = [], []
    for i in range(steps):
        opt.step()
        if metric is None:
            sched.step()
        else:
            sched.step(metric(i))
        lrs.append([g["lr"] for g in opt.param_groups] + list(sched.get_last_lr()))
        momenta.append([g["momentum"] if "momentum" in g else g.get("betas", (0.0,))[0]
                        for g in opt.param_groups])
    return np.array(lrs, dtype=float), np.array(momenta, dtype=float), sched, opt


@needs_torch
@pytest.mark.parametrize("name", list(SCHEDULES))
def test_schedule_matches_torch(name):
    opt_name, opt_kwargs, make = SCHEDULES[name]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # stepping in the right order warns about nothing
        lrs, momenta, ours, opt = _run(distgrad, opt_name, opt_kwargs, make)
    tlrs, tmomenta, theirs, topt = _run(torch, opt_name, opt_kwargs, make)
    np.testing.assert_allclose(lrs, tlrs, rtol=1e-12, atol=0)
    np.testing.assert_allclose(momenta, tmomenta, rtol=1e-12, atol=0)
    assert sorted(ours.state_dict()) == sorted(theirs.state_dict())
    assert sorted(opt.param_groups[0]) == sorted(topt.param_groups[0])  # initial_lr, max_lr...


@needs_torch
@pytest.mark.parametrize("kwargs", [
    {"patience": 3, "cooldown": 2, "min_lr": [1e-3, 1e-4], "threshold_mode": "abs",
     "threshold": 0.01},
    {"mode": "max", "factor": 0.5, "patience": 2, "eps": 1e-3},
    {"mode": "min", "threshold_mode": "rel", "threshold": 0.1, "patience": 0, "min_lr": 0.02},
    {"mode": "max", "threshold_mode": "abs", "patience": 1, "cooldown": 3},
])
def test_reduce_on_plateau_matches_torch(kwargs):
    def make(m, o):
        return m.ReduceLROnPlateau(o, **kwargs)

    def metric(i):
        return 1.0 / (1 + i % 13) + 0.001 * i
    lrs, _, ours, _ = _run(distgrad, "SGD", {}, make, metric=metric)
    tlrs, _, theirs, _ = _run(torch, "SGD", {}, make, metric=metric)
    np.testing.assert_allclose(lrs, tlrs, rtol=1e-12, atol=0)
    assert sorted(ours.state_dict()) == sorted(theirs.state_dict())
    assert ours.num_bad_epochs == theirs.num_bad_epochs and ours.best == theirs.best


@needs_torch
@pytest.mark.parametrize("name", ["StepLR", "MultiStepLR", "ExponentialLR", "CosineAnnealingLR",
                                  "LinearLR", "ConstantLR", "PolynomialLR",
                                  "CosineAnnealingWarmRestarts"])
def test_step_with_epoch_uses_closed_form_like_torch(name):
    opt_name, opt_kwargs, make = SCHEDULES[name]

    def run(lib):
        p = lib.nn.Parameter(lib.zeros(1))
        opt = getattr(lib.optim, opt_name)([p], lr=0.1)
        sched = make(lib.optim.lr_scheduler, opt)
        out = []
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            for epoch in (3, 9, 10, 4.5 if name == "CosineAnnealingWarmRestarts" else 4, 31, 50):
                opt.step()
                sched.step(epoch)
                out.append(sched.get_last_lr()[0])
        return out, [str(w.message) for w in caught]
    ours, our_warnings = run(distgrad)
    theirs, their_warnings = run(torch)
    np.testing.assert_allclose(ours, theirs, rtol=1e-12)
    assert our_warnings == their_warnings


def test_initial_lr_last_epoch_and_get_last_lr():
    p = nn.Parameter(distgrad.zeros(1))
    opt = optim.SGD([p], lr=0.1)
    sched = lr_scheduler.StepLR(opt, 2, gamma=0.5)
    assert opt.param_groups[0]["initial_lr"] == 0.1
    assert sched.last_epoch == 0 and sched.get_last_lr() == [0.1] and sched.base_lrs == [0.1]
    for _ in range(4):
        opt.step()
        sched.step()
    assert sched.last_epoch == 4 and sched.get_last_lr() == [0.025]
    # resuming with last_epoch needs initial_lr in every group
    fresh = optim.SGD([nn.Parameter(distgrad.zeros(1))], lr=0.1)
    with pytest.raises(KeyError, match="param 'initial_lr' is not specified in param_groups"):
        lr_scheduler.StepLR(fresh, 2, last_epoch=3)
    assert lr_scheduler._LRScheduler is lr_scheduler.LRScheduler
    assert isinstance(sched, lr_scheduler.LRScheduler)


def test_state_dict_round_trip_resumes_the_schedule():
    def build():
        p = nn.Parameter(distgrad.zeros(1))
        opt = optim.SGD([p], lr=0.1, momentum=0.9)
        return opt, lr_scheduler.OneCycleLR(opt, max_lr=1.0, total_steps=50)
    opt, sched = build()
    for _ in range(20):
        opt.step()
        sched.step()
    opt2, sched2 = build()
    opt2.load_state_dict(copy.deepcopy(opt.state_dict()))
    sched2.load_state_dict(copy.deepcopy(sched.state_dict()))
    for _ in range(20):
        for o, s in ((opt, sched), (opt2, sched2)):
            o.step()
            s.step()
        assert sched.get_last_lr() == sched2.get_last_lr()
        assert opt.param_groups[0]["momentum"] == opt2.param_groups[0]["momentum"]


def test_lambda_state_dict_saves_callable_objects_only():
    p, q = nn.Parameter(distgrad.zeros(1)), nn.Parameter(distgrad.zeros(1))
    opt = optim.SGD([{"params": [p]}, {"params": [q]}], lr=0.1)
    decay = _Decay(0.5)
    sched = lr_scheduler.LambdaLR(opt, [decay, lambda e: 1.0])
    sd = sched.state_dict()
    assert sd["lr_lambdas"] == [{"rate": 0.5}, None] and "optimizer" not in sd
    decay.rate = 0.1
    sched.load_state_dict(sd)
    assert decay.rate == 0.5


def test_warns_when_scheduler_steps_before_optimizer():
    p = nn.Parameter(distgrad.zeros(1))
    opt = optim.SGD([p], lr=0.1)
    sched = lr_scheduler.StepLR(opt, 1)
    with pytest.warns(UserWarning, match=r"Detected call of `lr_scheduler.step\(\)` before "
                                         r"`optimizer.step\(\)`"):
        sched.step()
    opt2 = optim.SGD([p], lr=0.1)
    sched2 = lr_scheduler.ExponentialLR(opt2, 0.9)
    opt2.step = lambda closure=None: None  # replaced after the scheduler wrapped it
    with pytest.warns(UserWarning, match="has been overridden after learning rate scheduler"):
        sched2.step()
    with pytest.warns(UserWarning, match="please use `get_last_lr\\(\\)`"):
        sched2.get_lr()


def test_tensor_lr_is_updated_in_place():
    p = nn.Parameter(distgrad.zeros(1))
    lr = distgrad.tensor(0.1, dtype=distgrad.float64)
    opt = optim.SGD([p], lr=0.1)
    opt.param_groups[0]["lr"] = lr
    sched = lr_scheduler.ExponentialLR(opt, 0.5)
    opt.step()
    sched.step()
    assert opt.param_groups[0]["lr"] is lr and lr.item() == pytest.approx(0.05)


@pytest.mark.parametrize("make,error,message", [
    (lambda o: lr_scheduler.StepLR(object(), 1), TypeError, "object is not an Optimizer"),
    (lambda o: lr_scheduler.ConstantLR(o, factor=2.0), ValueError,
     "Constant multiplicative factor expected to be between 0 and 1"),
    (lambda o: lr_scheduler.LinearLR(o, start_factor=0), ValueError,
     "Starting multiplicative factor expected"),
    (lambda o: lr_scheduler.LambdaLR(o, [lambda e: 1, lambda e: 1]), ValueError,
     "Expected 1 lr_lambdas, but got 2"),
    (lambda o: lr_scheduler.MultiplicativeLR(o, 0.5), TypeError,
     "lr_lambda should be a function, but got float"),
    (lambda o: lr_scheduler.ReduceLROnPlateau(o, factor=1.0), ValueError,
     "Factor should be < 1.0."),
    (lambda o: lr_scheduler.ReduceLROnPlateau(o, mode="average"), ValueError,
     "mode average is unknown!"),
    (lambda o: lr_scheduler.ReduceLROnPlateau(o, min_lr=[0.1, 0.2]), ValueError,
     "expected 1 min_lrs, got 2"),
    (lambda o: lr_scheduler.CosineAnnealingWarmRestarts(o, T_0=0), ValueError,
     "Expected positive integer T_0, but got 0"),
    (lambda o: lr_scheduler.OneCycleLR(o, max_lr=1.0), ValueError,
     r"You must define either total_steps OR \(epochs AND steps_per_epoch\)"),
    (lambda o: lr_scheduler.OneCycleLR(o, max_lr=1.0, total_steps=10, anneal_strategy="exp"),
     ValueError, "anneal_strategy must be one of 'cos' or 'linear'"),
    (lambda o: lr_scheduler.OneCycleLR(o, max_lr=[1.0, 2.0], total_steps=10), ValueError,
     "max_lr must have the same length as optimizer.param_groups"),
    (lambda o: lr_scheduler.CyclicLR(o, 0.1, 1.0, mode="sawtooth"), ValueError,
     "mode is invalid and scale_fn is None"),
    (lambda o: lr_scheduler.CyclicLR(optim.Adagrad([nn.Parameter(distgrad.zeros(1))]), 0.1, 1.0),
     ValueError, "optimizer must support momentum or beta1 with `cycle_momentum` option"),
    (lambda o: lr_scheduler.SequentialLR(o, [lr_scheduler.StepLR(o, 1)], milestones=[3]),
     ValueError, "expects number of schedulers provided to be one more than"),
    (lambda o: lr_scheduler.ChainedScheduler([]), ValueError,
     "expects at least one scheduler to be chained"),
    (lambda o: lr_scheduler.ChainedScheduler([lr_scheduler.ReduceLROnPlateau(o)]), ValueError,
     "does not support `ReduceLROnPlateau`"),
])
def test_errors(make, error, message):
    opt = optim.SGD([nn.Parameter(distgrad.zeros(1))], lr=0.1)
    with pytest.raises(error, match=message):
        make(opt)


def test_one_cycle_refuses_to_step_past_total_steps():
    opt = optim.SGD([nn.Parameter(distgrad.zeros(1))], lr=0.1)
    sched = lr_scheduler.OneCycleLR(opt, max_lr=1.0, total_steps=3)
    for _ in range(3):
        opt.step()
        sched.step()
    with pytest.raises(ValueError, match="Tried to step 4 times. The specified number of total "
                                         "steps is 3"):
        sched.step()


@needs_torch
@pytest.mark.parametrize("name", lr_scheduler.__all__)
def test_signatures_match_torch(name):
    import inspect

    def signature(fn):
        return [(p.name, p.kind, repr(p.default)) for p in inspect.signature(fn).parameters.values()]
    ours, theirs = getattr(lr_scheduler, name), getattr(torch.optim.lr_scheduler, name)
    assert sorted(lr_scheduler.__all__) == sorted(torch.optim.lr_scheduler.__all__)
    assert signature(ours.__init__) == signature(theirs.__init__)
    assert signature(ours.step) == signature(theirs.step)


# -- more of PyTorch's documented behaviour, compared value for value --

NESTED = {
    "SequentialLR_of_chained": ("SGD", {}, lambda m, o: m.SequentialLR(
        o, [m.ChainedScheduler([m.ConstantLR(o, 0.5, total_iters=4), m.ExponentialLR(o, 0.9)]),
            m.StepLR(o, 5, gamma=0.5)], milestones=[12])),
    "ChainedScheduler_with_optimizer": ("SGD", {}, lambda m, o: m.ChainedScheduler(
        [m.MultiStepLR(o, [5, 9], gamma=0.5), m.LinearLR(o, 0.5, total_iters=8)], optimizer=o)),
    "SequentialLR_three_cosine": ("SGD", {}, lambda m, o: m.SequentialLR(
        o, [m.ConstantLR(o, 0.1, total_iters=3), m.CosineAnnealingLR(o, 10, eta_min=0.01),
            m.PolynomialLR(o, total_iters=20)], milestones=[3, 30])),
    "MultiplicativeLR_per_group": ("SGD", {}, lambda m, o: m.MultiplicativeLR(
        o, [lambda e: 0.9, _Decay(0.999)])),
    "CosineAnnealingWarmRestarts_T_mult_1": ("SGD", {}, lambda m, o: m.CosineAnnealingWarmRestarts(
        o, T_0=7)),
    "CyclicLR_exp_range_sgd": ("SGD", {"momentum": 0.5}, lambda m, o: m.CyclicLR(
        o, 0.001, [0.1, 0.2], step_size_up=3, step_size_down=8, mode="exp_range", gamma=0.97,
        base_momentum=0.4, max_momentum=[0.9, 0.8])),
}


def _comparable(value):
    """A state-dict value reduced to what both libraries hold alike (callables drop out)."""
    if isinstance(value, dict):
        return {k: _comparable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_comparable(v) for v in value]
    if callable(value):
        return "<callable>"
    if isinstance(value, float):
        return round(value, 12)
    return value


@needs_torch
@pytest.mark.parametrize("name", list(SCHEDULES) + list(NESTED))
def test_state_dict_values_match_torch(name):
    """After 37 steps every entry of the state dict (attributes, counters, flags, nested
    schedulers' dicts) equals PyTorch's, so a checkpoint loads into either library."""
    opt_name, opt_kwargs, make = {**SCHEDULES, **NESTED}[name]
    caught = []
    for lib in (distgrad, torch):
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            caught.append((_run(lib, opt_name, opt_kwargs, make, steps=37),
                           [str(x.message) for x in w]))
    ((lrs, momenta, ours, _), our_warnings), ((tlrs, tmomenta, theirs, _), their_warnings) = caught
    # (a chain inside SequentialLR warns about step order in PyTorch too: the same warnings)
    assert our_warnings == their_warnings
    np.testing.assert_allclose(lrs, tlrs, rtol=1e-12, atol=0)
    np.testing.assert_allclose(momenta, tmomenta, rtol=1e-12, atol=0)
    assert _comparable(ours.state_dict()) == _comparable(theirs.state_dict())


@needs_torch
@pytest.mark.parametrize("name", list(SCHEDULES) + list(NESTED))
def test_loads_torch_state_dict_and_continues_like_torch(name):
    """A scheduler checkpointed by PyTorch resumes in distgrad (and the reverse) on the same
    schedule."""
    opt_name, opt_kwargs, make = {**SCHEDULES, **NESTED}[name]

    def resumed(lib, sched_state, group_state):
        p, q = lib.nn.Parameter(lib.zeros(2)), lib.nn.Parameter(lib.zeros(2))
        opt = getattr(lib.optim, opt_name)([{"params": [p]}, {"params": [q], "lr": 0.05}],
                                           lr=0.1, **opt_kwargs)
        sched = make(lib.optim.lr_scheduler, opt)
        for group, saved in zip(opt.param_groups, group_state):
            group.update({k: v for k, v in saved.items() if k != "params"})
        sched.load_state_dict(copy.deepcopy(sched_state))
        lrs = []
        for _ in range(30):
            opt.step()
            sched.step()
            lrs.append(list(sched.get_last_lr()) + [g["lr"] for g in opt.param_groups])
        return lrs
    _, _, ours, opt = _run(distgrad, opt_name, opt_kwargs, make, steps=23)
    _, _, theirs, topt = _run(torch, opt_name, opt_kwargs, make, steps=23)
    expected = resumed(torch, theirs.state_dict(), topt.state_dict()["param_groups"])
    np.testing.assert_allclose(resumed(distgrad, theirs.state_dict(),
                                       topt.state_dict()["param_groups"]), expected, rtol=1e-12)
    np.testing.assert_allclose(resumed(torch, ours.state_dict(),
                                       opt.state_dict()["param_groups"]), expected, rtol=1e-12)


RESUMABLE = ["StepLR", "MultiStepLR", "ExponentialLR", "CosineAnnealingLR", "LambdaLR",
             "LinearLR", "ConstantLR", "PolynomialLR", "CosineAnnealingWarmRestarts",
             "OneCycleLR_cos_sgd", "CyclicLR_triangular2", "CyclicLR_exp_range_adam"]


@needs_torch
@pytest.mark.parametrize("name", RESUMABLE)
def test_last_epoch_resumes_like_torch(name):
    """A new scheduler built with ``last_epoch=k`` on an optimizer that already holds
    ``initial_lr`` (a resumed run) continues as PyTorch's does."""
    opt_name, opt_kwargs, make = SCHEDULES[name]

    def run(lib):
        _, _, first, opt = _run(lib, opt_name, opt_kwargs, make, steps=11)
        sched = _remake(lib, make, opt, last_epoch=first.last_epoch)
        out = [list(sched.get_last_lr()), [g["lr"] for g in opt.param_groups]]
        for _ in range(25):
            opt.step()
            sched.step()
            out.append(list(sched.get_last_lr()))
        return out
    np.testing.assert_allclose(run(distgrad), run(torch), rtol=1e-12)


def _remake(lib, make, opt, last_epoch):
    """``make`` again, with ``last_epoch`` passed through (every factory calls one class)."""
    real = lib.optim.lr_scheduler

    class WithLastEpoch:
        def __getattr__(self, name):
            cls = getattr(real, name)
            return lambda *a, **k: cls(*a, **dict(k, last_epoch=last_epoch))
    return make(WithLastEpoch(), opt)


@needs_torch
def test_misuse_warns_like_torch():
    """The same warnings, in the same order, for the misuses PyTorch warns about."""
    def run(lib):
        m = lib.optim.lr_scheduler
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            p = lib.nn.Parameter(lib.zeros(1))
            opt = lib.optim.SGD([p], lr=0.1)
            sched = m.StepLR(opt, 2)
            sched.step()                       # before optimizer.step()
            sched.get_lr()                     # outside step
            opt.step()
            sched.step(5)                      # the deprecated epoch argument
            opt2 = lib.optim.SGD([p], lr=0.1)
            sched2 = m.CosineAnnealingLR(opt2, 10)
            opt2.step = lambda closure=None: None
            sched2.step()                      # optimizer.step replaced after wrapping
            opt3 = lib.optim.SGD([p], lr=0.1)
            plateau = m.ReduceLROnPlateau(opt3)
            plateau.step(1.0, epoch=3)
        return [(w.category, str(w.message)) for w in caught]
    assert run(distgrad) == run(torch)


@needs_torch
@pytest.mark.parametrize("min_lr", [0.001, [0.001, 0.002]])
def test_plateau_with_a_group_added_later_like_torch(min_lr):
    def run(lib):
        p, q = lib.nn.Parameter(lib.zeros(1)), lib.nn.Parameter(lib.zeros(1))
        opt = lib.optim.SGD([{"params": [p]}, {"params": [q]}], lr=0.1)
        sched = lib.optim.lr_scheduler.ReduceLROnPlateau(opt, patience=0, min_lr=min_lr)
        opt.add_param_group({"params": [lib.nn.Parameter(lib.zeros(1))], "lr": 0.5})
        out = []
        try:
            for metric in (3.0, 2.0, 2.5, 2.5, 2.5):
                sched.step(metric)
                out.append([g["lr"] for g in opt.param_groups])
        except RuntimeError as e:
            out.append(str(e))
        return out, sched.min_lrs
    assert run(distgrad) == run(torch)

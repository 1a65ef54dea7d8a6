"""Normal, Uniform, Bernoulli, Categorical and kl_divergence against torch.distributions:
values and gradients (w.r.t. parameters and values, given the same samples), shapes,
validation errors, and sampling statistics under a seed."""
import numpy as np
import pytest

import distgrad
from distgrad.distributions import (Bernoulli, Categorical, Distribution, ExponentialFamily,
                                    Normal, Uniform, constraints, kl_divergence, register_kl)
from distgrad.testing.oracle import check_op, torch

pytestmark = pytest.mark.timeout(60)
needs_torch = pytest.mark.skipif(torch is None, reason="PyTorch (the oracle) is not installed")

BITS = np.array([[0.0, 1.0, 1.0], [1.0, 0.0, 1.0]])
CLASSES = np.array([[2, 0], [3, 1], [1, 0]])  # sample_shape (3,) + batch_shape (2,)


def D(m):
    return m.distributions


def _summary(d, value, with_cdf=False):
    """Everything differentiable a distribution offers, as one list of tensors."""
    out = [d.log_prob(value), d.entropy(), d.mean, d.variance, d.stddev]
    if with_cdf:
        out.append(d.cdf(value))
    return out


CASES = [
    ("normal", lambda m, loc, s, v: _summary(D(m).Normal(loc, s.abs() + 0.2), v, True),
     [(2, 3), (2, 3), (2, 3)]),
    ("normal_broadcast_scalar_scale", lambda m, loc, v: D(m).Normal(loc, 1.5).log_prob(v),
     [(3,), (4, 3)]),
    ("normal_perplexity", lambda m, loc, s: D(m).Normal(loc, s.abs() + 0.5).perplexity(),
     [(3,), (3,)]),
    ("uniform", lambda m, lo, w, v: _summary(D(m).Uniform(lo, lo + w.abs() + 0.5),
                                             lo + (w.abs() + 0.5) * v.sigmoid(), True),
     [(2, 3), (2, 3), (2, 3)]),
    ("uniform_icdf", lambda m, lo, hi, q: D(m).Uniform(lo, lo + hi.abs() + 0.5).icdf(q.sigmoid()),
     [(3,), (3,), (3,)]),
    # a Bernoulli value stays 0/1: not differentiated (finite differences would leave the support)
    ("bernoulli_probs", lambda m, x, v: _summary(D(m).Bernoulli(probs=x.sigmoid()), v),
     [(2, 3), BITS], {"requires_grad": [True, False]}),
    ("bernoulli_logits", lambda m, x, v: _summary(D(m).Bernoulli(logits=x), v), [(2, 3), BITS],
     {"requires_grad": [True, False]}),
    ("bernoulli_logits_of_probs", lambda m, x: D(m).Bernoulli(probs=x.sigmoid()).logits,
     [(2, 3)]),
    ("bernoulli_probs_broadcast_value", lambda m, x, v: D(m).Bernoulli(logits=x).log_prob(v),
     [(3,), BITS], {"requires_grad": [True, False]}),
    ("categorical_probs", lambda m, x, v: [(c := D(m).Categorical(probs=x.exp())).log_prob(v),
                                           c.entropy(), c.probs, c.logits],
     [(2, 4), CLASSES]),
    ("categorical_logits", lambda m, x, v: [(c := D(m).Categorical(logits=x)).log_prob(v),
                                            c.entropy(), c.probs, c.logits],
     [(2, 4), CLASSES]),
    ("categorical_batch_broadcast", lambda m, x, v: D(m).Categorical(logits=x).log_prob(v),
     [(3, 4), np.array([[0], [3]])]),
    ("categorical_zero_prob_entropy",
     lambda m, x: D(m).Categorical(probs=x.exp() * m.tensor([1.0, 0.0, 1.0, 1.0],
                                                            dtype=m.float64)).entropy(),
     [(2, 4)]),
    ("kl_normal_normal", lambda m, a, b, c, d: D(m).kl_divergence(
        D(m).Normal(a, b.abs() + 0.1), D(m).Normal(c, d.abs() + 0.1)), [(3,), (3,), (3,), (3,)]),
    ("kl_bernoulli_bernoulli", lambda m, a, b: D(m).kl_divergence(
        D(m).Bernoulli(logits=a), D(m).Bernoulli(probs=b.sigmoid())), [(4,), (4,)]),
    ("kl_categorical_categorical", lambda m, a, b: D(m).kl_divergence(
        D(m).Categorical(logits=a), D(m).Categorical(probs=b.exp())), [(2, 5), (2, 5)]),
    ("kl_uniform_uniform", lambda m, a, w, c: D(m).kl_divergence(
        D(m).Uniform(a, a + w.abs() + 0.1), D(m).Uniform(a - c.abs() - 0.1, a + w.abs() + 1.0)),
     [(3,), (3,), (3,)]),
    ("kl_uniform_normal", lambda m, a, w, loc, s: D(m).kl_divergence(
        D(m).Uniform(a, a + w.abs() + 0.1), D(m).Normal(loc, s.abs() + 0.3)),
     [(3,), (3,), (3,), (3,)]),
]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_values_and_gradients(case):
    _, fn, shapes, *options = case
    check_op(fn, shapes, atol=1e-9, rtol=1e-9, **(options[0] if options else {}))


def test_kl_with_degenerate_q_is_infinite_where_p_has_mass():
    def kl(m, a):
        return D(m).kl_divergence(D(m).Bernoulli(probs=a.sigmoid()),
                                  D(m).Bernoulli(probs=m.tensor([0.0, 1.0, 0.5],
                                                                dtype=m.float64)))
    if torch is not None:
        check_op(kl, [(3,)], atol=1e-9, rtol=1e-9)
    a = distgrad.tensor([0.3, -0.2, 1.0], dtype=distgrad.float64, requires_grad=True)
    out = kl(distgrad, a)
    assert out[:2].tolist() == [float("inf")] * 2 and np.isfinite(out[2].item())


@needs_torch
@pytest.mark.parametrize("name", ["normal", "uniform"])
def test_rsample_gradients_match_torch_for_the_same_sample(name):
    """Reparameterised: x = loc + eps * scale (Normal), low + u * (high - low) (Uniform).
    Given distgrad's sample, torch rebuilds x from the same eps/u and must agree on the
    gradient of a function of x with respect to the parameters."""
    rng = np.random.default_rng(0)
    a = rng.standard_normal((2, 3))
    b = np.abs(rng.standard_normal((2, 3))) + 0.5
    pa = distgrad.tensor(a, requires_grad=True)
    pb = distgrad.tensor(b, requires_grad=True)
    dist = Normal(pa, pb) if name == "normal" else Uniform(pa, pa + pb)
    x = dist.rsample((4,))
    assert x.shape == (4, 2, 3) and x.grad_fn is not None and dist.has_rsample
    ((x ** 2).sin().sum()).backward()
    xs = x.detach().numpy()
    noise = (xs - a) / b  # eps for Normal, u for Uniform: the same algebra
    ta = torch.tensor(a, requires_grad=True)
    tb = torch.tensor(b, requires_grad=True)
    tx = ta + torch.tensor(noise) * tb
    ((tx ** 2).sin().sum()).backward()
    np.testing.assert_allclose(pa.grad.numpy(), ta.grad.numpy(), rtol=1e-10)
    np.testing.assert_allclose(pb.grad.numpy(), tb.grad.numpy(), rtol=1e-10)
    if name == "uniform":
        assert noise.min() >= 0 and noise.max() < 1


def test_sample_has_no_graph_and_shapes():
    loc = distgrad.zeros(2, 3, requires_grad=True)
    for d in (Normal(loc, 1.0), Uniform(loc, loc + 1), Bernoulli(logits=loc),
              Categorical(logits=loc)):
        s = d.sample((5, 4))
        assert not s.requires_grad
        event = d.batch_shape
        assert s.shape == (5, 4) + tuple(event)
        assert d.sample().shape == tuple(event)
    c = Categorical(logits=loc)
    assert c.batch_shape == (2,) and c.event_shape == () and c.sample().dtype == distgrad.int64
    assert Normal(0.0, 1.0).batch_shape == () and Normal(0.0, 1.0).sample().shape == ()
    assert Bernoulli(0.3).sample((3,)).shape == (3,)
    assert not Bernoulli(0.3).has_rsample and not Categorical(logits=loc).has_rsample
    with pytest.raises(NotImplementedError):
        Categorical(logits=loc).rsample()


def test_sampling_statistics_under_a_seed():
    distgrad.manual_seed(0)
    n = Normal(distgrad.tensor([1.0, -2.0], dtype=distgrad.float64),
               distgrad.tensor([0.5, 3.0], dtype=distgrad.float64)).sample((20000,))
    assert n.dtype == distgrad.float64
    np.testing.assert_allclose(n.mean(0).numpy(), [1.0, -2.0], atol=0.06)
    np.testing.assert_allclose(n.std(0).numpy(), [0.5, 3.0], rtol=0.03)
    u = Uniform(distgrad.tensor([0.0, 5.0]), distgrad.tensor([1.0, 9.0])).rsample((20000,))
    assert (u[:, 0] >= 0).all() and (u[:, 0] < 1).all() and (u[:, 1] >= 5).all()
    np.testing.assert_allclose(u.mean(0).numpy(), [0.5, 7.0], atol=0.05)
    b = Bernoulli(probs=distgrad.tensor([0.1, 0.7])).sample((20000,))
    np.testing.assert_allclose(b.mean(0).numpy(), [0.1, 0.7], atol=0.02)
    c = Categorical(probs=distgrad.tensor([[0.2, 0.3, 0.5], [1.0, 0.0, 0.0]])).sample((20000,))
    freq = np.stack([np.bincount(col, minlength=3) / 20000 for col in c.numpy().T])
    np.testing.assert_allclose(freq, [[0.2, 0.3, 0.5], [1.0, 0.0, 0.0]], atol=0.02)
    # the same seed, the same samples
    distgrad.manual_seed(7)
    first = [Normal(0.0, 1.0).sample((3,)).tolist(), Categorical(logits=distgrad.zeros(5))
             .sample((3,)).tolist(), Bernoulli(0.5).sample((3,)).tolist()]
    distgrad.manual_seed(7)
    second = [Normal(0.0, 1.0).sample((3,)).tolist(), Categorical(logits=distgrad.zeros(5))
              .sample((3,)).tolist(), Bernoulli(0.5).sample((3,)).tolist()]
    assert first == second


@needs_torch
@pytest.mark.parametrize("make,message", [
    (lambda m: D(m).Normal(m.tensor([0.0, 1.0]), m.tensor([1.0, -1.0])),
     r"Expected parameter scale \(Tensor of shape \(2,\)\) of distribution Normal\(loc: "),
    (lambda m: D(m).Normal(0.0, 1.0).log_prob(m.tensor(float("nan"))),
     r"Expected value argument \(Tensor of shape \(\)\) to be within the support \(Real\(\)\)"),
    (lambda m: D(m).Bernoulli(probs=m.tensor([0.5, 1.5])),
     r"to satisfy the constraint Interval\(lower_bound=0.0, upper_bound=1.0\)"),
    (lambda m: D(m).Bernoulli(probs=m.tensor([0.5])).log_prob(m.tensor([0.5])),
     r"to be within the support \(Boolean\(\)\)"),
    (lambda m: D(m).Categorical(probs=m.tensor([0.5, -0.5, 1.0])),
     r"to satisfy the constraint Simplex\(\)"),
    (lambda m: D(m).Categorical(logits=m.zeros(3)).log_prob(m.tensor(3)),
     r"to be within the support \(IntegerInterval\(lower_bound=0, upper_bound=2\)\)"),
    (lambda m: D(m).Uniform(m.tensor([0.0]), m.tensor([0.0])),
     r"Expected parameter low .* to satisfy the constraint LessThan\(upper_bound="),
    (lambda m: D(m).Uniform(0.0, 1.0).log_prob(m.tensor(1.5)),
     r"to be within the support \(Interval\(lower_bound="),
    (lambda m: D(m).Normal(m.zeros(3), 1.0).log_prob(m.zeros(2)),
     r"Value is not broadcastable with batch_shape\+event_shape"),
    (lambda m: D(m).Normal(0.0, 1.0).log_prob(0.5),
     "The value argument to log_prob must be a Tensor"),
    (lambda m: D(m).Bernoulli(), r"Either `probs` or `logits` must be specified, but not both."),
    (lambda m: D(m).Categorical(probs=m.ones(2), logits=m.ones(2)),
     r"Either `probs` or `logits` must be specified, but not both."),
    (lambda m: D(m).Categorical(probs=m.tensor(1.0)),
     "`probs` parameter must be at least one-dimensional."),
    (lambda m: D(m).Normal("a", 1.0), "Input arguments must all be instances of Number"),
])
def test_validation_errors_match_torch(make, message):
    for lib in (distgrad, torch):
        with pytest.raises(ValueError, match=message):
            make(lib)


def test_validation_can_be_turned_off():
    d = Normal(0.0, -1.0, validate_args=False)
    assert np.isnan(d.log_prob(distgrad.tensor(0.0)).item())
    assert Bernoulli(probs=distgrad.tensor([0.5]), validate_args=False).log_prob(
        distgrad.tensor([0.5])).shape == (1,)
    try:
        Distribution.set_default_validate_args(False)
        Normal(0.0, -1.0)
    finally:
        Distribution.set_default_validate_args(True)
    with pytest.raises(ValueError):
        Normal(0.0, -1.0)


def test_expand_and_enumerate_support():
    d = Normal(distgrad.tensor([0.0, 1.0]), 1.0).expand((3, 2))
    assert d.batch_shape == (3, 2) and d.sample().shape == (3, 2)
    c = Categorical(logits=distgrad.zeros(4)).expand((2,))
    assert c.batch_shape == (2,) and c.logits.shape == (2, 4)
    b = Bernoulli(probs=distgrad.tensor([0.2, 0.4]))
    assert b.enumerate_support().tolist() == [[0.0, 0.0], [1.0, 1.0]]
    assert b.enumerate_support(expand=False).shape == (2, 1)
    assert Categorical(logits=distgrad.zeros(2, 3)).enumerate_support().shape == (3, 2)
    assert Uniform(0.0, 2.0).expand((4,)).log_prob(distgrad.ones(4)).shape == (4,)
    if torch is not None:
        tb = torch.distributions.Bernoulli(probs=torch.tensor([0.2, 0.5, 0.7]))
        ours = Bernoulli(probs=distgrad.tensor([0.2, 0.5, 0.7]))
        np.testing.assert_array_equal(ours.mode.numpy(), tb.mode.numpy())
        assert Categorical(logits=distgrad.tensor([[0.0, 2.0], [3.0, 1.0]])).mode.tolist() == \
            torch.distributions.Categorical(logits=torch.tensor([[0.0, 2.0], [3.0, 1.0]])
                                            ).mode.tolist()


def test_exponential_family_entropy_agrees_with_closed_forms():
    n = Normal(distgrad.tensor([0.0, 1.0], dtype=distgrad.float64),
               distgrad.tensor([0.5, 2.0], dtype=distgrad.float64))
    np.testing.assert_allclose(ExponentialFamily.entropy(n).detach().numpy(),
                               n.entropy().numpy(), rtol=1e-12)
    b = Bernoulli(logits=distgrad.tensor([-1.0, 0.5], dtype=distgrad.float64))
    np.testing.assert_allclose(ExponentialFamily.entropy(b).detach().numpy(),
                               b.entropy().numpy(), rtol=1e-12)


def test_kl_dispatch_and_registration():
    with pytest.raises(NotImplementedError, match="No KL\\(p \\|\\| q\\) is implemented for p "
                                                  "type Categorical and q type Normal"):
        kl_divergence(Categorical(logits=distgrad.zeros(2)), Normal(0.0, 1.0))
    assert kl_divergence(Normal(0.0, 1.0), Uniform(0.0, 1.0)).item() == float("inf")

    class Wide(Normal):
        pass
    assert kl_divergence(Wide(0.0, 1.0), Normal(1.0, 1.0)).item() == 0.5  # inherits
    register_kl(Wide, Normal)(lambda p, q: distgrad.tensor(-1.0))
    assert kl_divergence(Wide(0.0, 1.0), Normal(1.0, 1.0)).item() == -1.0
    with pytest.raises(TypeError, match="Expected type_p to be a Distribution subclass"):
        register_kl(int, Normal)


def test_constraints():
    x = distgrad.tensor([-1.0, 0.0, 0.5, 1.0, 2.0])
    assert constraints.positive.check(x).tolist() == [False, False, True, True, True]
    assert constraints.nonnegative.check(x).tolist() == [False, True, True, True, True]
    assert constraints.unit_interval.check(x).tolist() == [False, True, True, True, False]
    assert constraints.boolean.check(x).tolist() == [False, True, False, True, False]
    assert constraints.integer_interval(0, 1).check(x).tolist() == [False, True, False, True,
                                                                     False]
    assert constraints.half_open_interval(0, 1).check(x).tolist() == [False, True, True, False,
                                                                       False]
    assert constraints.simplex.check(distgrad.tensor([[0.5, 0.5], [0.5, 0.6]])).tolist() == \
        [True, False]
    assert constraints.real_vector.check(distgrad.tensor([[1.0, float("nan")],
                                                          [1.0, 2.0]])).tolist() == [False, True]
    assert constraints.real_vector.event_dim == 1 and constraints.boolean.is_discrete
    assert constraints.is_dependent(Uniform.support) and not constraints.is_dependent(
        constraints.real)
    assert repr(constraints.unit_interval) == "Interval(lower_bound=0.0, upper_bound=1.0)"
    assert repr(constraints.real_vector) == "IndependentConstraint(Real(), 1)"
    with pytest.raises(ValueError, match="Cannot determine validity of dependent constraint"):
        constraints.dependent.check(x)


@needs_torch
@pytest.mark.parametrize("name", ["Normal", "Uniform", "Bernoulli", "Categorical"])
def test_signatures_match_torch(name):
    import inspect

    def signature(fn):
        return [(p.name, p.kind, repr(p.default).replace("torch.", "distgrad."))
                for p in inspect.signature(fn).parameters.values()]
    ours, theirs = getattr(distgrad.distributions, name), getattr(torch.distributions, name)
    for method in ("__init__", "sample", "rsample", "log_prob", "entropy", "expand", "cdf",
                   "icdf", "enumerate_support"):
        assert signature(getattr(ours, method)) == signature(getattr(theirs, method)), method
    assert ours.has_rsample == theirs.has_rsample
    assert ours.has_enumerate_support == theirs.has_enumerate_support

"""What older PyTorch programs use: legacy tensor types and constructors, ``Tensor.new*``,
formatting 0-d tensors, and the random fills and samplers."""
import numpy as np
import pytest

import distgrad
from distgrad.testing.oracle import torch

pytestmark = pytest.mark.timeout(60)
needs_torch = pytest.mark.skipif(torch is None, reason="PyTorch (the oracle) is not installed")

LEGACY_CALLS = [
    ("FloatTensor", (2, 3)), ("FloatTensor", ([1, 2],)), ("FloatTensor", ()),
    ("FloatTensor", ((1, 2),)), ("FloatTensor", (5,)), ("LongTensor", ([1.7, 2],)),
    ("DoubleTensor", ([[1, 2], [3, 4]],)), ("BoolTensor", ([1, 0],)), ("IntTensor", ([1, 0],)),
    ("ByteTensor", (3,)), ("Tensor", (2, 3)), ("Tensor", ([1, 2],)), ("Tensor", ([[1, 2]],)),
    ("Tensor", ()), ("FloatTensor", (np.ones(2),)),
]


@needs_torch
@pytest.mark.parametrize("name,args", LEGACY_CALLS, ids=str)
def test_legacy_constructors_match_torch(name, args):
    ours = getattr(distgrad, name)(*args)
    theirs = getattr(torch, name)(*args)
    assert tuple(ours.shape) == tuple(theirs.shape)
    assert str(ours.dtype).split(".")[-1] == str(theirs.dtype).split(".")[-1]
    if args and not isinstance(args[0], int):
        np.testing.assert_array_equal(ours.numpy(), theirs.numpy())


def test_legacy_sizes_tensors_and_errors():
    assert distgrad.FloatTensor(distgrad.Size([2, 1])).shape == (2, 1)
    src = distgrad.ones(2)
    alias = distgrad.FloatTensor(src)
    alias.add_(1)
    assert src.tolist() == [2.0, 2.0]  # the same storage, as in PyTorch
    assert distgrad.Tensor(distgrad.ones(2, dtype=distgrad.int64)).dtype == distgrad.int64
    with pytest.raises(TypeError, match=r"expected FloatTensor \(got LongTensor\)"):
        distgrad.FloatTensor(distgrad.ones(2, dtype=distgrad.int64))
    with pytest.raises(TypeError, match="type must be tuple of ints,but got float"):
        distgrad.FloatTensor(2, 3.0)
    with pytest.raises(RuntimeError, match=r"Trying to create tensor with negative dimension -1"):
        distgrad.FloatTensor(-1)
    with pytest.raises(TypeError):
        distgrad.FloatTensor([1.0], dtype=distgrad.float64)  # as in PyTorch: no dtype here
    # the old idiom for a layer's weight
    w = distgrad.nn.Parameter(distgrad.Tensor(4, 3))
    distgrad.nn.init.zeros_(w)
    assert w.shape == (4, 3) and w.requires_grad


def test_isinstance_checks_the_dtype():
    x = distgrad.zeros(2)
    assert isinstance(x, distgrad.FloatTensor) and not isinstance(x, distgrad.LongTensor)
    assert isinstance(distgrad.nn.Parameter(x), distgrad.FloatTensor)
    assert isinstance(distgrad.zeros(2, dtype=distgrad.int64), distgrad.LongTensor)
    assert isinstance(distgrad.tensor([True]), distgrad.BoolTensor)
    assert not isinstance([1.0], distgrad.FloatTensor)
    assert isinstance(x, distgrad.Tensor)
    assert distgrad.FloatTensor.dtype is distgrad.float32


def test_type_conversions_with_legacy_types():
    x = distgrad.tensor([1.5, 2.5])
    assert x.type(distgrad.LongTensor).dtype == distgrad.int64
    assert x.type("torch.IntTensor").dtype == distgrad.int32
    assert x.type(distgrad.float64).dtype == distgrad.float64
    with pytest.raises(ValueError, match="invalid type: 'torch.NoSuchTensor'"):
        x.type("torch.NoSuchTensor")


@needs_torch
def test_new_methods_match_torch():
    for lib in (distgrad, torch):
        x = lib.ones(2, 3, dtype=lib.float64)
        made = [x.new(4), x.new([1, 2]), x.new(), x.new_zeros(2, 2), x.new_zeros((2, 2)),
                x.new_ones(3, device="cpu"), x.new_empty((1, 2)), x.new_full((2,), 7, device="cpu"),
                x.new_tensor([1, 2], device=x.device), x.new_tensor([1, 2], dtype=lib.int64),
                x.new_zeros(2, requires_grad=True)]
        shapes = [tuple(t.shape) for t in made]
        dtypes = [str(t.dtype).split(".")[-1] for t in made]
        values = [t.tolist() for t in made[3:6] + made[7:10]]
        grads = [t.requires_grad for t in made]
        if lib is distgrad:
            ours = (shapes, dtypes, values, grads)
    assert ours == (shapes, dtypes, values, grads)


@needs_torch
def test_new_tensor_copies_and_detaches():
    x = distgrad.ones(2, requires_grad=True)
    y = x.new_tensor(x)
    assert not y.requires_grad and y.is_leaf
    y.add_(1)
    assert x.tolist() == [1.0, 1.0]


def test_format_of_zero_dim_tensors():
    loss = distgrad.tensor(0.123456, requires_grad=True) * 1
    assert f"{loss:.4f}" == "0.1235"
    assert "{:+.2f}".format(distgrad.tensor(2.0)) == "+2.00"
    assert f"{distgrad.tensor(7):>4d}" == "   7"
    assert f"{distgrad.tensor(3)}" == "3"
    assert f"{distgrad.ones(2)}" == str(distgrad.ones(2))
    with pytest.raises(TypeError, match="unsupported format string passed to Tensor.__format__"):
        f"{distgrad.ones(2):.2f}"
    # the conversions format does not touch
    t = distgrad.tensor(1.5)
    assert t.item() == 1.5 and t.tolist() == 1.5 and t.numpy().shape == ()
    if torch is not None:
        assert f"{torch.tensor(0.123456):.4f}" == f"{distgrad.tensor(0.123456):.4f}"
        with pytest.raises(TypeError, match="unsupported format string passed to Tensor"):
            f"{torch.ones(2):.2f}"


# -- random fills and samplers --

def test_random_fills_are_seeded_and_in_range():
    distgrad.manual_seed(0)
    a = distgrad.empty(1000).uniform_(-2, 3)
    distgrad.manual_seed(0)
    b = distgrad.empty(1000).uniform_(-2, 3)
    assert a.tolist() == b.tolist()
    assert a.min().item() >= -2 and a.max().item() < 3 and abs(a.mean().item() - 0.5) < 0.15
    n = distgrad.empty(20000, dtype=distgrad.float64).normal_(1.0, 2.0)
    assert abs(n.mean().item() - 1.0) < 0.05 and abs(n.std().item() - 2.0) < 0.05
    e = distgrad.empty(20000).exponential_(4.0)
    assert abs(e.mean().item() - 0.25) < 0.01 and e.min().item() >= 0
    r = distgrad.empty(5000).random_(3, 7)
    assert set(r.tolist()) == {3.0, 4.0, 5.0, 6.0}
    assert set(distgrad.empty(2000, dtype=distgrad.int64).random_(4).tolist()) == {0, 1, 2, 3}
    big = distgrad.empty(1000).random_()
    assert big.min().item() >= 0 and big.max().item() <= 2 ** 24 and big.max().item() > 2 ** 20
    assert set(distgrad.empty(100, dtype=distgrad.bool).random_().tolist()) == {False, True}
    bern = distgrad.empty(20000).bernoulli_(0.3)
    assert set(bern.tolist()) == {0.0, 1.0} and abs(bern.mean().item() - 0.3) < 0.02
    p = distgrad.tensor([0.0, 1.0, 0.5]).expand(4000, 3)
    draws = distgrad.empty(4000, 3).bernoulli_(p)
    assert draws[:, 0].sum().item() == 0 and draws[:, 1].sum().item() == 4000
    g = distgrad.Generator().manual_seed(3)
    assert distgrad.empty(3).normal_(generator=g).tolist() == \
        distgrad.empty(3).normal_(generator=distgrad.Generator().manual_seed(3)).tolist()


def test_fills_give_zero_gradient_and_refuse_leaves():
    w = distgrad.ones(3, requires_grad=True)
    with pytest.raises(RuntimeError, match="a leaf Variable that requires grad"):
        w.normal_()
    h = w * 2
    h.uniform_()
    assert type(h.grad_fn).__name__ == "UniformBackward0"
    (h * 3).sum().backward()
    assert w.grad.tolist() == [0.0, 0.0, 0.0]


def test_bernoulli_and_multinomial_statistics():
    distgrad.manual_seed(1)
    probs = distgrad.tensor([0.1, 0.5, 0.9]).expand(5000, 3)
    mean = distgrad.bernoulli(probs).mean(0)
    np.testing.assert_allclose(mean.numpy(), [0.1, 0.5, 0.9], atol=0.03)
    rows = distgrad.tensor([[1.0, 2.0, 7.0, 0.0], [0.0, 0.0, 1.0, 1.0]])
    s = distgrad.multinomial(rows, 20000, replacement=True)
    assert s.dtype == distgrad.int64 and s.shape == (2, 20000)
    freq = np.stack([np.bincount(r, minlength=4) / 20000 for r in s.numpy()])
    np.testing.assert_allclose(freq, [[0.1, 0.2, 0.7, 0.0], [0.0, 0.0, 0.5, 0.5]], atol=0.015)
    # without replacement: distinct categories per row, never a zero-probability one
    w = distgrad.multinomial(distgrad.tensor([0.0, 1.0, 5.0, 1.0]).expand(3000, 4), 3)
    assert all(len(set(r)) == 3 and 0 not in r for r in w.tolist())
    first = np.bincount(w[:, 0].numpy(), minlength=4) / 3000
    np.testing.assert_allclose(first, [0.0, 1 / 7, 5 / 7, 1 / 7], atol=0.03)
    assert distgrad.multinomial(distgrad.tensor([0.2, 0.8]), 1).shape == (1,)
    # as PyTorch: once the positive categories are used up, the others fill the row
    assert sorted(distgrad.multinomial(distgrad.tensor([0.0, 0.5, 1.0]), 3).tolist()) == [0, 1, 2]


SAMPLER_ERRORS = [
    (lambda m: m.bernoulli(m.tensor([0.0, 1.5])), RuntimeError,
     r"Expected p_in >= 0 && p_in <= 1 to be true"),
    (lambda m: m.zeros(3).bernoulli_(1.5), RuntimeError, "bernoulli_ expects p to be in"),
    (lambda m: m.multinomial(m.tensor([0.0, 0.5, 1.0]), 4), RuntimeError,
     "cannot sample n_sample > prob_dist.size"),
    (lambda m: m.multinomial(m.tensor([0.0, -0.5, 1.0]), 1, True), RuntimeError,
     "probability tensor contains either `inf`, `nan` or element < 0"),
    (lambda m: m.multinomial(m.tensor([0.0, 0.0]), 1, True), RuntimeError,
     r"invalid multinomial distribution \(sum of probabilities <= 0\)"),
    (lambda m: m.multinomial(m.ones(2, 2, 2), 1, True), RuntimeError,
     "prob_dist must be 1 or 2 dim"),
    (lambda m: m.multinomial(m.tensor([0.0, 0.5, 1.0]), 0), RuntimeError,
     "cannot sample n_sample <= 0 samples"),
    (lambda m: m.multinomial(m.tensor([1, 2]), 1), RuntimeError,
     "multinomial only supports floating-point dtypes for input, got: Long"),
    (lambda m: m.zeros(5).random_(5, 3), RuntimeError,
     "random_ expects 'from' to be less than 'to', but got from=5 >= to=3"),
    (lambda m: m.zeros(3).uniform_(2, 1), RuntimeError,
     r"uniform_ expects to return a \[from, to\) range, but found from=2 > to=1"),
    (lambda m: m.zeros(3).normal_(0, -1), RuntimeError, "normal expects std >= 0.0"),
]


@pytest.mark.parametrize("make,error,message", SAMPLER_ERRORS)
def test_sampler_errors_match_torch(make, error, message):
    with pytest.raises(error, match=message):
        make(distgrad)
    if torch is not None:
        with pytest.raises(error, match=message):
            make(torch)

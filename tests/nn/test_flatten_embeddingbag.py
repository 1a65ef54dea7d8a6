"""Flatten, Unflatten, Identity, EmbeddingBag, F.pad and F.one_hot against PyTorch."""
import numpy as np
import pytest

import distgrad
from distgrad import nn
from distgrad.autograd import gradcheck, gradgradcheck
from distgrad.nn import functional as F
from distgrad.testing.oracle import check_op, torch

pytestmark = pytest.mark.timeout(60)
needs_torch = pytest.mark.skipif(torch is None, reason="torch not installed")


def raises_like_torch(fn, exc, match):
    """``fn(lib)`` raises ``exc`` (matching ``match``) for distgrad, and for torch when present."""
    libs = [distgrad] + ([torch] if torch is not None else [])
    for lib in libs:
        with pytest.raises(exc, match=match):
            fn(lib)


# Flatten / Unflatten / Identity

@pytest.mark.parametrize("args,shape", [((), (2, 3, 4)), ((0, -1), (2, 3, 4)),
                                        ((1, 2), (2, 3, 4, 5)), ((2, -1), (2, 3, 4)),
                                        ((0, 0), (2, 3))])
def test_flatten(args, shape):
    check_op(lambda m, x: m.nn.Flatten(*args)(x), [shape])


@pytest.mark.parametrize("dim,sizes", [(1, (2, 5)), (-1, [5, -1]), (0, (1, 3))])
def test_unflatten(dim, sizes):
    check_op(lambda m, x: m.nn.Unflatten(dim, sizes)(x), [(3, 10)])


def test_flatten_unflatten_repr_and_errors():
    assert repr(nn.Flatten()) == "Flatten(start_dim=1, end_dim=-1)"
    assert repr(nn.Unflatten(1, (2, -1))) == "Unflatten(dim=1, unflattened_size=(2, -1))"
    raises_like_torch(lambda m: m.nn.Unflatten(1, 5), TypeError, "must be a tuple of ints")
    raises_like_torch(lambda m: m.nn.Unflatten(1, [2, "a"]), TypeError, "element of type str")
    raises_like_torch(lambda m: m.nn.Unflatten(1, (2, 5))(m.zeros(3, 9)), RuntimeError,
                      "don't multiply up to the size of dim 1")
    raises_like_torch(lambda m: m.nn.Flatten(2, 1)(m.zeros(3, 9, 2)), RuntimeError,
                      "start_dim cannot come after end_dim")


def test_identity_accepts_and_ignores_arguments():
    ident = nn.Identity(54, unused_argument1=0.1, unused_argument2=False)
    x = distgrad.randn(2, 3)
    assert ident(x) is x
    assert repr(ident) == "Identity()"
    assert not list(ident.parameters())


# EmbeddingBag

def _bag_pair(cls_kwargs, seed=0):
    theirs = torch.nn.EmbeddingBag(7, 3, **cls_kwargs)
    ours = nn.EmbeddingBag(7, 3, **cls_kwargs)
    ours.load_state_dict({"weight": distgrad.tensor(theirs.weight.detach().numpy().copy())})
    return ours, theirs


BAG_CASES = {
    "sum_offsets": ({"mode": "sum"}, [1, 2, 4, 5, 4, 3, 2, 6], [0, 3, 3, 6], None),
    "mean_offsets_empty_bag": ({"mode": "mean"}, [1, 2, 4, 5, 4, 3], [0, 2, 2, 5], None),
    "max_offsets": ({"mode": "max"}, [1, 2, 4, 5, 4, 3, 0], [0, 3, 5], None),
    "mean_2d": ({"mode": "mean"}, [[1, 2, 3], [4, 4, 0]], None, None),
    "max_2d_ties": ({"mode": "max"}, [[1, 1, 3], [4, 4, 4]], None, None),
    "sum_per_sample_weights": ({"mode": "sum"}, [1, 2, 4, 5, 4, 3], [0, 2, 4], "psw"),
    "sum_2d_per_sample_weights": ({"mode": "sum"}, [[1, 2, 3], [4, 4, 0]], None, "psw"),
    "mean_padding": ({"mode": "mean", "padding_idx": 4}, [1, 4, 4, 5, 4, 3, 4], [0, 3, 4], None),
    "max_padding": ({"mode": "max", "padding_idx": 2}, [1, 2, 2, 5, 4, 3], [0, 1, 3], None),
    "sum_padding_psw": ({"mode": "sum", "padding_idx": -1}, [1, 6, 4, 6, 4, 3], [0, 2], "psw"),
    "include_last_offset": ({"mode": "sum", "include_last_offset": True}, [1, 2, 4, 5, 4, 3],
                            [0, 2, 2, 6], None),
}


@needs_torch
@pytest.mark.parametrize("case", list(BAG_CASES), ids=list(BAG_CASES))
def test_embedding_bag_matches_torch(case):
    kwargs, indices, offsets, psw = BAG_CASES[case]
    ours, theirs = _bag_pair(kwargs)
    rng = np.random.default_rng(1)
    psw_array = rng.standard_normal(np.shape(indices)).astype(np.float32) if psw else None
    outs = []
    for lib, module in ((distgrad, ours), (torch, theirs)):
        call = {"offsets": None if offsets is None else lib.tensor(offsets)}
        if psw:
            call["per_sample_weights"] = lib.tensor(psw_array, requires_grad=True)
        outs.append((module(lib.tensor(indices), **call), call.get("per_sample_weights")))
    (out, p), (tout, tp) = outs
    np.testing.assert_allclose(out.detach().numpy(), tout.detach().numpy(), rtol=1e-6, atol=1e-6)
    g = rng.standard_normal(tuple(tout.shape)).astype(np.float32)
    out.backward(distgrad.tensor(g))
    tout.backward(torch.tensor(g))
    np.testing.assert_allclose(ours.weight.grad.numpy(), theirs.weight.grad.numpy(), rtol=1e-5,
                               atol=1e-6)
    if psw:
        np.testing.assert_allclose(p.grad.numpy(), tp.grad.numpy(), rtol=1e-5, atol=1e-6)


@needs_torch
@pytest.mark.parametrize("mode", ["sum", "mean"])
def test_scale_grad_by_freq_as_documented(mode):
    """Each row's gradient divided by its index's count in the mini-batch, which is what
    torch's Embedding does (its CPU EmbeddingBag scales rows by the count of another index:
    indices [0, 1, 1, 2, 2, 2] give row 2 a gradient of 1.5, not 1)."""
    indices, offsets = [1, 2, 1, 5, 1, 2], [0, 3]
    ours = nn.EmbeddingBag(7, 3, mode=mode, scale_grad_by_freq=True)
    emb = torch.nn.Embedding(7, 3, scale_grad_by_freq=True)
    emb.weight.data = torch.tensor(ours.weight.detach().numpy().copy())
    out = ours(distgrad.tensor(indices), distgrad.tensor(offsets))
    rows = emb(torch.tensor(indices))
    bags = [rows[:3], rows[3:]]
    tout = torch.stack([b.sum(0) if mode == "sum" else b.mean(0) for b in bags])
    np.testing.assert_allclose(out.detach().numpy(), tout.detach().numpy(), rtol=1e-6)
    out.sum().backward()
    tout.sum().backward()
    np.testing.assert_allclose(ours.weight.grad.numpy(), emb.weight.grad.numpy(), rtol=1e-6)
    ours_emb = nn.Embedding(7, 3, scale_grad_by_freq=True)
    ours_emb(distgrad.tensor(indices)).sum().backward()
    np.testing.assert_allclose(ours_emb.weight.grad.numpy(), np.where(
        np.isin(np.arange(7), indices)[:, None], 1.0, 0.0) * np.ones((7, 3)))


@needs_torch
def test_embedding_bag_max_norm_and_from_pretrained():
    w = np.random.default_rng(2).standard_normal((7, 3)).astype(np.float32) * 3
    ours = nn.EmbeddingBag.from_pretrained(distgrad.tensor(w.copy()), max_norm=1.0, mode="sum")
    theirs = torch.nn.EmbeddingBag.from_pretrained(torch.tensor(w.copy()), max_norm=1.0,
                                                   mode="sum")
    assert not ours.weight.requires_grad
    idx, off = [1, 2, 4, 5], [0, 2]
    np.testing.assert_allclose(ours(distgrad.tensor(idx), distgrad.tensor(off)).numpy(),
                               theirs(torch.tensor(idx), torch.tensor(off)).numpy(), rtol=1e-5)
    np.testing.assert_allclose(ours.weight.detach().numpy(), theirs.weight.detach().numpy(),
                               rtol=1e-5)
    assert repr(ours) == repr(theirs)


@needs_torch
def test_embedding_bag_module_matches_torch():
    for kw in ({}, {"mode": "max", "padding_idx": -1, "max_norm": 1.0}):
        ours, theirs = nn.EmbeddingBag(5, 3, **kw), torch.nn.EmbeddingBag(5, 3, **kw)
        assert repr(ours) == repr(theirs)
        assert list(ours.state_dict()) == list(theirs.state_dict())
    bag = nn.EmbeddingBag(5, 3, padding_idx=2)
    assert not np.any(bag.weight.detach().numpy()[2])


def test_embedding_bag_gradcheck():
    """The fused node in float64: weight and per-sample weights, first and second order."""
    rng = np.random.default_rng(3)
    w = distgrad.tensor(rng.standard_normal((6, 3)), requires_grad=True)
    psw = distgrad.tensor(rng.standard_normal(7), requires_grad=True)
    idx, off = distgrad.tensor([1, 2, 4, 5, 4, 3, 0]), distgrad.tensor([0, 3, 3, 6])

    def bag_sum(w, psw):
        return F.embedding_bag(idx, w, off, mode="sum", per_sample_weights=psw, padding_idx=4)
    assert gradcheck(bag_sum, (w, psw))
    assert gradgradcheck(bag_sum, (w, psw))
    for mode in ("mean", "max"):
        assert gradcheck(lambda w: F.embedding_bag(idx, w, off, mode=mode), (w,))


def test_embedding_bag_errors():
    w2 = lambda m: m.randn(5, 3)  # noqa: E731
    raises_like_torch(lambda m: m.nn.functional.embedding_bag(m.tensor([1, 2]), w2(m),
                                                               m.tensor([1])),
                      RuntimeError, "offsets\\[0\\] has to be 0")
    raises_like_torch(lambda m: m.nn.functional.embedding_bag(m.tensor([1, 2]), w2(m),
                                                               m.tensor([0, 7])),
                      RuntimeError, "offsets\\[-1\\] can not be greater than input's length")
    raises_like_torch(lambda m: m.nn.functional.embedding_bag(m.tensor([1, 7]), w2(m),
                                                               m.tensor([0])),
                      RuntimeError, "Index 1 of input takes value 7")
    raises_like_torch(lambda m: m.nn.functional.embedding_bag(m.tensor([1.0]), w2(m),
                                                               m.tensor([0])),
                      RuntimeError, "'indices' to have one of the following scalar types")
    raises_like_torch(lambda m: m.nn.functional.embedding_bag(m.tensor([1, 2]), w2(m)),
                      ValueError, "offsets has to be a 1D Tensor but got None")
    raises_like_torch(lambda m: m.nn.functional.embedding_bag(m.tensor([[1, 2]]), w2(m),
                                                               m.tensor([0])),
                      ValueError, "if input is 2D, then offsets has to be None")
    raises_like_torch(lambda m: m.nn.functional.embedding_bag(m.tensor([1, 2]), w2(m),
                                                               m.tensor([0]), mode="median"),
                      ValueError, "mode has to be one of sum, mean or max")
    raises_like_torch(lambda m: m.nn.functional.embedding_bag(
        m.tensor([1, 2]), w2(m), m.tensor([0]), mode="mean", per_sample_weights=m.ones(2)),
        NotImplementedError, "only supported for mode='sum'")
    raises_like_torch(lambda m: m.nn.functional.embedding_bag(
        m.tensor([1, 2]), w2(m), m.tensor([0]), mode="sum", per_sample_weights=m.ones(3)),
        ValueError, "must have the same shape as the input")
    raises_like_torch(lambda m: m.nn.functional.embedding_bag(
        m.tensor([1, 2]), w2(m), m.tensor([0]), mode="max", scale_grad_by_freq=True),
        ValueError, "max mode does not support scaling")
    raises_like_torch(lambda m: m.nn.EmbeddingBag(5, 3, padding_idx=5), AssertionError,
                      "padding_idx must be within num_embeddings")


# F.pad and F.one_hot

PAD_CASES = [((2, 3, 5), (2, 1)), ((2, 3, 5), (-1, 2)), ((2, 3, 5), (2, -1)), ((3, 5), (1, 2)),
             ((1, 2, 4, 5), (1, 2, 3, 0)), ((1, 2, 3, 4, 5), (1, 1, 2, 0, 1, 2))]


@pytest.mark.parametrize("mode", ["constant", "reflect", "replicate", "circular"])
@pytest.mark.parametrize("shape,pad", PAD_CASES, ids=[str(p) for _, p in PAD_CASES])
def test_pad_modes(mode, shape, pad):
    check_op(lambda m, x: m.nn.functional.pad(x, pad, mode=mode), [shape])


def test_pad_constant_value_and_any_rank():
    check_op(lambda m, x: m.nn.functional.pad(x, (1, 1, -1, 0, 2, 0), value=3.5), [(2, 3, 4)])
    check_op(lambda m, x: m.nn.functional.pad(x, (2, 1)), [(4,)])
    check_op(lambda m, x: m.nn.functional.pad(x, (3, 3), mode="circular"), [(1, 3)])


def test_pad_errors():
    x = lambda m: m.zeros(1, 2, 3)  # noqa: E731
    raises_like_torch(lambda m: m.nn.functional.pad(x(m), (3, 3), mode="reflect"), RuntimeError,
                      "Padding size should be less than the corresponding input dimension")
    raises_like_torch(lambda m: m.nn.functional.pad(x(m), (4, 4), mode="circular"), RuntimeError,
                      "wrapping around more than once")
    raises_like_torch(lambda m: m.nn.functional.pad(x(m), (1, 1), mode="reflect", value=1.0),
                      RuntimeError, "doesn't take in value argument")
    raises_like_torch(lambda m: m.nn.functional.pad(x(m), (1, 1, 1, 1, 1, 1), mode="replicate"),
                      NotImplementedError, "Padding size 6 is not supported for 3D input")
    raises_like_torch(lambda m: m.nn.functional.pad(m.zeros(3), (1, 1), mode="reflect"),
                      NotImplementedError, "not supported for 1D input")
    raises_like_torch(lambda m: m.nn.functional.pad(x(m), (1,)), RuntimeError,
                      "Padding length must be divisible by 2")
    raises_like_torch(lambda m: m.nn.functional.pad(x(m), (1,) * 8), RuntimeError,
                      "less than or equal to two times the input dimension")
    raises_like_torch(lambda m: m.nn.functional.pad(x(m), (1, 1), mode="bogus"),
                      NotImplementedError, "Unrecognised padding mode bogus")
    raises_like_torch(lambda m: m.nn.functional.pad(x(m), (-2, -2)), RuntimeError,
                      "length must be non-negative")


@needs_torch
@pytest.mark.parametrize("values,num_classes", [([1, 0, 3], -1), ([[1, 2], [0, 0]], 5), (2, 3),
                                                 ([], 3)])
def test_one_hot_matches_torch(values, num_classes):
    ours = F.one_hot(distgrad.tensor(values, dtype=distgrad.int64), num_classes)
    theirs = torch.nn.functional.one_hot(torch.tensor(values, dtype=torch.int64), num_classes)
    assert ours.dtype == distgrad.int64
    np.testing.assert_array_equal(ours.numpy(), theirs.numpy())


def test_one_hot_errors():
    raises_like_torch(lambda m: m.nn.functional.one_hot(m.tensor([1.0, 2.0])), RuntimeError,
                      "only applicable to index tensor of type LongTensor")
    raises_like_torch(lambda m: m.nn.functional.one_hot(m.tensor([1, 2], dtype=m.int32)),
                      RuntimeError, "only applicable to index tensor of type LongTensor")
    raises_like_torch(lambda m: m.nn.functional.one_hot(m.tensor([1, -2])), RuntimeError,
                      "Class values must be non-negative")
    raises_like_torch(lambda m: m.nn.functional.one_hot(m.tensor([1, 5]), 3), RuntimeError,
                      "Class values must be smaller than num_classes")
    raises_like_torch(lambda m: m.nn.functional.one_hot(m.tensor([], dtype=m.int64)),
                      RuntimeError, "Can not infer total number of classes from empty tensor")

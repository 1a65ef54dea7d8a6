"""BatchNorm1d/2d/3d and channel dropout against PyTorch: values, gradients, running statistics."""
import warnings

import numpy as np
import pytest

import distgrad
import distgrad.nn.functional as F
from distgrad import nn
from distgrad.autograd import gradcheck, gradgradcheck
from distgrad.testing.oracle import torch
from layer_pairs import TOL, module_pair

pytestmark = pytest.mark.timeout(60)
needs_torch = pytest.mark.skipif(torch is None, reason="torch not installed")


BN_CASES = [
    ("bn1d-2d", lambda m: m.BatchNorm1d(3), (6, 3)),
    ("bn1d-3d", lambda m: m.BatchNorm1d(3, momentum=0.3), (4, 3, 5)),
    ("bn2d", lambda m: m.BatchNorm2d(3), (2, 3, 4, 5)),
    ("bn2d-cumulative", lambda m: m.BatchNorm2d(3, momentum=None), (2, 3, 3, 3)),
    ("bn2d-no-affine", lambda m: m.BatchNorm2d(3, affine=False), (2, 3, 3, 4)),
    ("bn2d-no-bias", lambda m: m.BatchNorm2d(3, bias=False, eps=1e-3), (2, 3, 3, 4)),
    ("bn2d-no-stats", lambda m: m.BatchNorm2d(3, track_running_stats=False), (2, 3, 3, 4)),
    ("bn3d", lambda m: m.BatchNorm3d(2), (2, 2, 2, 3, 3)),
]


def _affine(build):
    """``build`` with distgrad's weight and bias away from their ones/zeros start (PyTorch's
    copy gets them from ``module_pair``), so both matter."""
    def make(m):
        module = build(m)
        if m is nn:
            rng = np.random.default_rng(5)
            with distgrad.no_grad():
                for p in module.parameters():
                    p.copy_(distgrad.tensor(rng.standard_normal(tuple(p.shape)), dtype=p.dtype))
        return module
    return make


@needs_torch
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("name,build,shape", BN_CASES, ids=[c[0] for c in BN_CASES])
def test_batchnorm_train_then_eval_matches_torch(name, build, shape, dtype):
    ours, theirs = module_pair(_affine(build), dtype)
    rng = np.random.default_rng(1)
    for step, training in enumerate([True, True, True, False, True, False]):
        ours.train(training)
        theirs.train(training)
        data = (rng.standard_normal(shape) * 3 + step).astype(dtype)
        x, tx = distgrad.tensor(data, requires_grad=True), torch.tensor(data, requires_grad=True)
        out, tout = ours(x), theirs(tx)
        np.testing.assert_allclose(out.detach().numpy(), tout.detach().numpy(), **TOL[dtype])
        g = rng.standard_normal(shape).astype(dtype)
        out.backward(distgrad.tensor(g))
        tout.backward(torch.tensor(g))
        np.testing.assert_allclose(x.grad.numpy(), tx.grad.numpy(), **TOL[dtype])
        for p, tp in zip(ours.parameters(), theirs.parameters()):
            np.testing.assert_allclose(p.grad.numpy(), tp.grad.numpy(), **TOL[dtype])
        for (k, b), (tk, tb) in zip(ours.state_dict().items(), theirs.state_dict().items()):
            assert k == tk
            assert b.dtype.is_floating_point == tb.dtype.is_floating_point, k
            np.testing.assert_allclose(b.numpy(), tb.numpy(), err_msg=k, **TOL[dtype])


@needs_torch
@pytest.mark.parametrize("build", [c[1] for c in BN_CASES], ids=[c[0] for c in BN_CASES])
def test_batchnorm_state_dict_buffers_and_repr(build):
    ours, theirs = build(nn), build(torch.nn)
    assert list(ours.state_dict()) == list(theirs.state_dict())
    assert [n for n, _ in ours.named_buffers()] == [n for n, _ in theirs.named_buffers()]
    assert sum(p.numel() for p in ours.parameters()) == sum(p.numel() for p in theirs.parameters())
    assert repr(ours) == repr(theirs)
    if ours.track_running_stats:
        assert ours.num_batches_tracked.dtype == distgrad.int64
        assert ours.running_mean.tolist() == [0.0] * ours.num_features
        assert ours.running_var.tolist() == [1.0] * ours.num_features
    else:
        assert ours.running_mean is None and ours.num_batches_tracked is None


def test_batchnorm_running_stats_rules():
    bn = nn.BatchNorm1d(2, momentum=None)
    xs = [distgrad.tensor([[0.0, 1.0], [2.0, 5.0]]), distgrad.tensor([[4.0, 0.0], [6.0, 0.0]])]
    for x in xs:
        bn(x)
    # momentum=None: the running estimates are the plain average of the batches'
    assert bn.num_batches_tracked.item() == 2
    np.testing.assert_allclose(bn.running_mean.numpy(), [3.0, 1.5])
    np.testing.assert_allclose(bn.running_var.numpy(), [2.0, 4.0])  # unbiased: (2 + 2)/2, (8+0)/2
    bn.eval()
    before = bn.running_mean.numpy().copy()
    out = bn(distgrad.tensor([[3.0, 1.5]]))  # one sample is fine in eval
    np.testing.assert_array_equal(bn.running_mean.numpy(), before)
    np.testing.assert_allclose(out.detach().numpy(), [[0.0, 0.0]], atol=1e-6)
    bn.reset_running_stats()
    assert bn.num_batches_tracked.item() == 0 and bn.running_var.tolist() == [1.0, 1.0]


def test_batchnorm_double_precision_and_dtype_moves():
    bn = nn.BatchNorm2d(3).double()
    assert bn.running_mean.dtype == distgrad.float64
    assert bn.num_batches_tracked.dtype == distgrad.int64
    out = bn(distgrad.randn(2, 3, 2, 2, dtype=distgrad.float64))
    assert out.dtype == distgrad.float64


def test_batch_norm_gradcheck_and_gradgradcheck():
    rng = np.random.default_rng(2)
    x = distgrad.tensor(rng.standard_normal((3, 2, 2)), requires_grad=True)
    w = distgrad.tensor(rng.standard_normal(2), requires_grad=True)
    b = distgrad.tensor(rng.standard_normal(2), requires_grad=True)
    train = lambda x, w, b: F.batch_norm(x, None, None, w, b, training=True)  # noqa: E731
    assert gradcheck(train, (x, w, b))
    assert gradgradcheck(train, (x, w, b))
    mean, var = distgrad.tensor([0.5, -1.0], dtype=distgrad.float64), \
        distgrad.tensor([2.0, 0.5], dtype=distgrad.float64)
    evaluate = lambda x, w, b: F.batch_norm(x, mean, var, w, b, training=False)  # noqa: E731
    assert gradcheck(evaluate, (x, w, b))
    assert gradgradcheck(evaluate, (x, w, b))


@pytest.mark.parametrize("call,exc,match", [
    (lambda: nn.BatchNorm1d(3)(distgrad.randn(2, 3, 4, 5)), ValueError,
     "expected 2D or 3D input \\(got 4D input\\)"),
    (lambda: nn.BatchNorm2d(3)(distgrad.randn(2, 3, 4)), ValueError,
     "expected 4D input \\(got 3D input\\)"),
    (lambda: nn.BatchNorm2d(3)(distgrad.randn(2, 4, 4, 4)), RuntimeError,
     "running_mean should contain 4 elements not 3"),
    (lambda: nn.BatchNorm1d(3)(distgrad.randn(1, 3)), ValueError,
     "Expected more than 1 value per channel when training"),
    (lambda: F.batch_norm(distgrad.randn(4, 3), None, None, training=False), RuntimeError,
     "running_mean must be defined in evaluation mode"),
    (lambda: F.batch_norm(distgrad.randn(4, 3), None, None, distgrad.ones(4), training=True),
     RuntimeError, "weight should contain 3 elements not 4"),
    (lambda: F.batch_norm(distgrad.randn(4, 3), None, None, training=True, eps=0), ValueError,
     "eps must be positive"),
    (lambda: F.batch_norm(distgrad.ones(4, 3, dtype=distgrad.int64), None, None, training=True),
     NotImplementedError, "\"batch_norm\" not implemented for 'Long'"),
])
def test_batchnorm_errors(call, exc, match):
    with pytest.raises(exc, match=match):
        call()


# ---------------------------------------------------------------- channel dropout
@pytest.mark.parametrize("module,shape", [(nn.Dropout2d, (4, 6, 3, 5)), (nn.Dropout1d, (4, 6, 7)),
                                          (nn.Dropout1d, (6, 7))])
def test_channel_dropout_zeros_whole_channels(module, shape):
    distgrad.manual_seed(0)
    drop = module(p=0.4)
    x = distgrad.ones(*shape, requires_grad=True)
    out = drop(x)
    channels = out.detach().numpy().reshape(shape[:len(shape) - 1 - (len(shape) == 4)] + (-1,))
    per_channel = channels.reshape(-1, channels.shape[-1])
    for row in per_channel:  # each channel is either all zero or all 1/(1-p)
        assert np.allclose(row, 0) or np.allclose(row, 1 / 0.6)
    assert 0 < (per_channel[:, 0] == 0).sum() < per_channel.shape[0]
    out.sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), out.detach().numpy())
    drop.eval()
    assert drop(x) is x


@needs_torch
def test_channel_dropout_repr_and_edges():
    assert repr(nn.Dropout2d()) == repr(torch.nn.Dropout2d())
    assert repr(nn.Dropout1d(0.2, inplace=True)) == repr(torch.nn.Dropout1d(0.2, inplace=True))
    x = distgrad.randn(2, 3, 4, 4)
    assert not F.dropout2d(x, p=1.0).numpy().any()
    assert F.dropout2d(x, p=0.0) is x
    y = x.clone()
    F.dropout2d(y, p=1.0, inplace=True)
    assert not y.numpy().any()
    assert not isinstance(nn.Dropout2d(), nn.Dropout)  # siblings, as in PyTorch


def test_channel_dropout_errors_and_warnings():
    with pytest.raises(ValueError, match="dropout probability has to be between 0 and 1"):
        nn.Dropout2d(1.5)
    with pytest.raises(ValueError, match="dropout probability"):
        F.dropout1d(distgrad.randn(2, 3), p=-0.1)
    with pytest.raises(RuntimeError, match="dropout1d: Expected 2D or 3D input, but received a 4D"):
        F.dropout1d(distgrad.randn(2, 3, 4, 5))
    with pytest.warns(UserWarning, match="Received a 3D input to dropout2d"):
        F.dropout2d(distgrad.randn(2, 3, 4))
    with pytest.warns(UserWarning, match="Received a 5-D input to dropout2d"):
        F.dropout2d(distgrad.randn(1, 2, 3, 4, 5))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        F.dropout2d(distgrad.randn(2, 3, 4, 5))

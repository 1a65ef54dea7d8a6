"""Convolution and pooling layers against PyTorch: values, gradients, parameters, repr, errors."""
import math

import numpy as np
import pytest

import distgrad
import distgrad.nn.functional as F
from distgrad import nn
from distgrad.autograd import gradcheck, gradgradcheck
from distgrad.testing.oracle import torch
from layer_pairs import assert_pairs_close, run_both

pytestmark = pytest.mark.timeout(60)
needs_torch = pytest.mark.skipif(torch is None, reason="torch not installed")

CONV_CASES = [
    ("conv2d", lambda m: m.Conv2d(3, 4, 3), (2, 3, 7, 6)),
    ("conv2d-strided", lambda m: m.Conv2d(4, 6, (3, 2), stride=(2, 1), padding=(1, 2),
                                          dilation=(1, 2), groups=2), (2, 4, 9, 8)),
    ("conv2d-dilated", lambda m: m.Conv2d(2, 3, 3, padding=2, dilation=2, bias=False),
     (1, 2, 6, 7)),
    ("conv2d-same-even", lambda m: m.Conv2d(2, 3, 4, padding="same"), (2, 2, 6, 5)),
    ("conv2d-valid-stride3", lambda m: m.Conv2d(2, 3, 3, stride=3, padding="valid"), (2, 2, 8, 7)),
    ("conv2d-depthwise", lambda m: m.Conv2d(4, 8, 3, padding=1, groups=4), (2, 4, 5, 5)),
    ("conv2d-unbatched", lambda m: m.Conv2d(3, 2, 2), (3, 5, 4)),
    ("conv2d-reflect", lambda m: m.Conv2d(2, 3, 3, padding=(1, 2), padding_mode="reflect"),
     (2, 2, 5, 6)),
    ("conv2d-replicate", lambda m: m.Conv2d(2, 3, 3, padding=2, padding_mode="replicate"),
     (1, 2, 4, 4)),
    ("conv2d-circular", lambda m: m.Conv2d(2, 3, 3, padding="same", padding_mode="circular"),
     (1, 2, 4, 5)),
    ("conv1d", lambda m: m.Conv1d(3, 5, 3, stride=2, padding=1), (2, 3, 9)),
    ("conv1d-dilated-groups", lambda m: m.Conv1d(4, 2, 2, dilation=3, groups=2), (2, 4, 8)),
    ("conv1d-same-unbatched", lambda m: m.Conv1d(2, 3, 4, padding="same", bias=False), (2, 7)),
]


@needs_torch
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("name,build,shape", CONV_CASES, ids=[c[0] for c in CONV_CASES])
def test_conv_matches_torch(name, build, shape, dtype):
    assert_pairs_close(run_both(build, [shape], dtype), dtype)


POOL_CASES = [
    ("maxpool2d", lambda m: m.MaxPool2d(2), (2, 3, 6, 7)),
    ("maxpool2d-overlap", lambda m: m.MaxPool2d(3, stride=1, padding=1), (2, 2, 5, 5)),
    ("maxpool2d-all", lambda m: m.MaxPool2d((3, 2), stride=(2, 1), padding=(1, 1),
                                           dilation=(2, 1), ceil_mode=True), (2, 2, 7, 6)),
    ("maxpool2d-ceil", lambda m: m.MaxPool2d(3, stride=2, ceil_mode=True), (1, 2, 6, 6)),
    ("maxpool2d-indices", lambda m: m.MaxPool2d(2, return_indices=True), (2, 2, 4, 6)),
    ("maxpool2d-unbatched", lambda m: m.MaxPool2d(2), (3, 4, 4)),
    ("maxpool1d", lambda m: m.MaxPool1d(3, stride=2, padding=1, return_indices=True), (2, 3, 9)),
    ("maxpool1d-unbatched", lambda m: m.MaxPool1d(2, dilation=2, ceil_mode=True), (3, 8)),
    ("avgpool2d", lambda m: m.AvgPool2d(2), (2, 3, 6, 7)),
    ("avgpool2d-pad", lambda m: m.AvgPool2d(3, stride=2, padding=1), (2, 2, 7, 6)),
    ("avgpool2d-nopadcount", lambda m: m.AvgPool2d(3, 2, 1, ceil_mode=True,
                                                   count_include_pad=False), (2, 2, 7, 6)),
    ("avgpool2d-ceil", lambda m: m.AvgPool2d(3, 2, 1, ceil_mode=True), (1, 2, 7, 6)),
    ("avgpool2d-divisor", lambda m: m.AvgPool2d((3, 2), stride=2, padding=1,
                                                divisor_override=5), (2, 2, 6, 5)),
    ("avgpool1d", lambda m: m.AvgPool1d(3, stride=2, padding=1, count_include_pad=False),
     (2, 3, 8)),
    ("adaptive2d", lambda m: m.AdaptiveAvgPool2d((3, 4)), (2, 3, 7, 9)),
    ("adaptive2d-global", lambda m: m.AdaptiveAvgPool2d(1), (2, 3, 5, 5)),
    ("adaptive2d-none", lambda m: m.AdaptiveAvgPool2d((None, 2)), (3, 5, 5)),
    ("adaptive2d-upsample", lambda m: m.AdaptiveAvgPool2d((6, 7)), (1, 2, 4, 5)),
    ("adaptive1d", lambda m: m.AdaptiveAvgPool1d(4), (2, 3, 10)),
]


@needs_torch
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("name,build,shape", POOL_CASES, ids=[c[0] for c in POOL_CASES])
def test_pool_matches_torch(name, build, shape, dtype):
    assert_pairs_close(run_both(build, [shape], dtype), dtype)


@needs_torch
def test_maxpool_ties_and_nan_pick_torchs_index():
    data = np.array([[[[1.0, 1.0, 0.0, np.nan],
                       [1.0, 0.5, np.nan, 2.0]]]], dtype=np.float32)
    ours, oi = F.max_pool2d(distgrad.tensor(data), 2, return_indices=True)
    theirs, ti = torch.nn.functional.max_pool2d(torch.tensor(data), 2, return_indices=True)
    np.testing.assert_array_equal(oi.numpy(), ti.numpy())
    np.testing.assert_array_equal(ours.numpy(), theirs.numpy())


@needs_torch
@pytest.mark.parametrize("build", [lambda m: m.Conv2d(3, 4, 3, groups=1, bias=False),
                                   lambda m: m.Conv1d(4, 6, 5, groups=2),
                                   lambda m: m.Conv2d(2, 2, 1, padding="same",
                                                      padding_mode="circular")])
def test_conv_parameters_state_dict_and_repr(build):
    ours, theirs = build(nn), build(torch.nn)
    assert list(ours.state_dict()) == list(theirs.state_dict())
    assert [tuple(p.shape) for p in ours.parameters()] == \
        [tuple(p.shape) for p in theirs.parameters()]
    assert repr(ours) == repr(theirs)
    for attr in ("kernel_size", "stride", "padding", "dilation", "groups", "padding_mode",
                 "_reversed_padding_repeated_twice"):
        assert getattr(ours, attr) == getattr(theirs, attr), attr


@needs_torch
def test_pool_repr_and_attributes():
    for build in (lambda m: m.MaxPool2d(2), lambda m: m.MaxPool2d((2, 3), 1, 1, 2, True, True),
                  lambda m: m.MaxPool1d(3), lambda m: m.AvgPool2d(3, 2, 1, True, False, 3),
                  lambda m: m.AvgPool1d(3), lambda m: m.AdaptiveAvgPool2d((None, 3)),
                  lambda m: m.AdaptiveAvgPool1d(2)):
        ours, theirs = build(nn), build(torch.nn)
        assert repr(ours) == repr(theirs)
        assert ours.stride == theirs.stride if hasattr(theirs, "stride") else True


def test_conv_default_init_bounds():
    distgrad.manual_seed(0)
    conv = nn.Conv2d(16, 32, 5)
    fan_in = 16 * 25
    bound = 1 / math.sqrt(fan_in)  # kaiming_uniform(a=sqrt(5)) and the bias: 1/sqrt(fan_in)
    w, b = conv.weight.detach().numpy(), conv.bias.detach().numpy()
    assert 0.95 * bound < np.abs(w).max() <= bound
    assert abs(w.std() - bound / math.sqrt(3)) < 0.03 * bound
    assert 0.5 * bound < np.abs(b).max() <= bound
    assert conv.weight.dtype == distgrad.float32
    assert nn.Conv1d(2, 4, 3, dtype=distgrad.float64).weight.dtype == distgrad.float64


def test_conv_grad_fn_is_one_fused_node():
    x = distgrad.randn(2, 3, 6, 6, requires_grad=True)
    y = nn.Conv2d(3, 4, 3)(x)
    assert type(y.grad_fn).__name__ == "ConvolutionBackward0"
    assert y.grad_fn._saved_stride == (1, 1) and y.grad_fn._saved_groups == 1
    assert type(F.max_pool2d(x, 2).grad_fn).__name__ == "MaxPool2DWithIndicesBackward0"
    assert type(F.avg_pool2d(x, 2).grad_fn).__name__ == "AvgPool2DBackward0"
    assert type(F.adaptive_avg_pool2d(x, 2).grad_fn).__name__ == "AdaptiveAvgPool2DBackward0"


def _dbl(*shape, seed=0):
    rng = np.random.default_rng(seed)
    return distgrad.tensor(rng.standard_normal(shape), requires_grad=True)


def test_conv_gradcheck_and_gradgradcheck():
    x, w, b = _dbl(1, 2, 4, 5), _dbl(2, 1, 2, 3, seed=1), _dbl(2, seed=2)
    fn = lambda x, w, b: F.conv2d(x, w, b, stride=(1, 2), padding=1, groups=2)  # noqa: E731
    assert gradcheck(fn, (x, w, b))
    small = lambda x, w: F.conv2d(x, w, padding=1, dilation=(2, 1))  # noqa: E731
    assert gradgradcheck(small, (_dbl(1, 1, 3, 3), _dbl(1, 1, 2, 2, seed=3)))
    assert gradgradcheck(lambda x, w: F.conv1d(x, w, stride=2), (_dbl(1, 1, 5), _dbl(2, 1, 2)))


def test_pool_gradchecks():
    x = _dbl(1, 2, 5, 5)
    assert gradcheck(lambda t: F.max_pool2d(t, 3, stride=2, padding=1, ceil_mode=True), (x,))
    assert gradcheck(lambda t: F.avg_pool2d(t, 3, 2, 1, count_include_pad=False), (x,))
    assert gradcheck(lambda t: F.adaptive_avg_pool2d(t, (3, 2)), (x,))
    assert gradgradcheck(lambda t: F.avg_pool2d(t, 2, 1, 1), (_dbl(1, 1, 3, 3),))
    assert gradgradcheck(lambda t: F.max_pool1d(t, 2), (_dbl(1, 2, 4),))
    assert gradgradcheck(lambda t: F.adaptive_avg_pool1d(t, 2), (_dbl(1, 1, 5),))


@needs_torch
def test_conv_double_backward_matches_torch():
    """A gradient penalty through conv, pooling and relu: second order stays fused."""
    rng = np.random.default_rng(4)
    arrays = [rng.standard_normal(s) for s in [(2, 2, 6, 6), (3, 2, 3, 3), (3,)]]

    def penalty(lib, x, w, b):
        fn = lib.nn.functional
        y = fn.avg_pool2d(fn.max_pool2d(fn.conv2d(x, w, b, padding=1).tanh(), 2), 2, 1)
        (gx,) = lib.autograd.grad((y * y).sum(), x, create_graph=True)
        return (gx * gx).sum()

    ours = [distgrad.tensor(a, requires_grad=True) for a in arrays]
    theirs = [torch.tensor(a, requires_grad=True) for a in arrays]
    p, tp = penalty(distgrad, *ours), penalty(torch, *theirs)
    np.testing.assert_allclose(p.item(), tp.item(), rtol=1e-10)
    for a, b in zip(distgrad.autograd.grad(p, ours), torch.autograd.grad(tp, theirs)):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-8, atol=1e-10)


@pytest.mark.parametrize("call,exc,match", [
    (lambda: F.conv2d(distgrad.randn(2, 3, 8), distgrad.randn(4, 3, 3, 3)), RuntimeError,
     "expected input\\[1, 2, 3, 8\\] to have 3 channels"),
    (lambda: F.conv2d(distgrad.randn(1, 2, 3, 8, 8), distgrad.randn(4, 3, 3, 3)), RuntimeError,
     "Expected 3D \\(unbatched\\) or 4D \\(batched\\) input to conv2d"),
    (lambda: F.conv1d(distgrad.randn(2, 3, 8, 8), distgrad.randn(4, 3, 3)), RuntimeError,
     "input to conv1d"),
    (lambda: F.conv2d(distgrad.randn(2, 3, 8, 8), distgrad.randn(4, 2, 3, 3), groups=2),
     RuntimeError, "Given groups=2, weight of size \\[4, 2, 3, 3\\], expected input"),
    (lambda: F.conv2d(distgrad.randn(2, 4, 8, 8), distgrad.randn(3, 2, 3, 3), groups=2),
     RuntimeError, "expected weight to be divisible by 2"),
    (lambda: F.conv2d(distgrad.randn(2, 3, 8, 8), distgrad.randn(4, 3, 9, 9)), RuntimeError,
     "Kernel size can't be greater than actual input size"),
    (lambda: F.conv2d(distgrad.randn(2, 3, 8, 8), distgrad.randn(4, 3, 3, 3), distgrad.randn(5)),
     RuntimeError, "expected bias to be 1-dimensional with 4 elements"),
    (lambda: F.conv2d(distgrad.randn(2, 3, 8, 8), distgrad.randn(4, 3, 3, 3), stride=2,
                      padding="same"), RuntimeError, "not supported for strided"),
    (lambda: F.conv2d(distgrad.randn(2, 3, 8, 8), distgrad.randn(4, 3, 3, 3), padding="full"),
     RuntimeError, "Invalid padding string"),
    (lambda: F.conv2d(distgrad.randn(2, 3, 8, 8), distgrad.randn(4, 3, 3, 3), padding=(1, 1, 1)),
     RuntimeError, "expected padding to be a single integer value or a list of 2 values"),
    (lambda: F.conv2d(distgrad.randn(2, 3, 8, 8), distgrad.randn(4, 3, 3, 3), stride=0),
     RuntimeError, "non-positive stride"),
    (lambda: F.conv2d(distgrad.randn(2, 3, 8, 8, dtype=distgrad.float64),
                      distgrad.randn(4, 3, 3, 3)), RuntimeError, "expected scalar type Double"),
    (lambda: F.conv2d(distgrad.ones(1, 1, 4, 4, dtype=distgrad.int64),
                      distgrad.ones(1, 1, 2, 2, dtype=distgrad.int64)), NotImplementedError,
     "\"conv2d\" not implemented for 'Long'"),
    (lambda: nn.Conv2d(3, 4, 3, groups=2), ValueError, "in_channels must be divisible by groups"),
    (lambda: nn.Conv2d(4, 3, 3, groups=2), ValueError, "out_channels must be divisible by groups"),
    (lambda: nn.Conv2d(4, 4, 3, groups=0), ValueError, "groups must be a positive integer"),
    (lambda: nn.Conv2d(4, 4, 3, padding_mode="mirror"), ValueError, "padding_mode must be one of"),
    (lambda: nn.Conv2d(4, 4, 3, padding="full"), ValueError, "Invalid padding string 'full'"),
    (lambda: nn.Conv2d(4, 4, 3, stride=2, padding="same"), ValueError, "strided convolutions"),
    (lambda: nn.Conv2d(4, 3, 3)(distgrad.randn(2, 3, 8, 8)), RuntimeError,
     "to have 4 channels, but got 3 channels instead"),
    (lambda: nn.Conv2d(4, 3, 3)(distgrad.randn(8, 8)), RuntimeError, "input to conv2d"),
    (lambda: nn.Conv2d(4, 3, 3, padding=5, padding_mode="reflect")(distgrad.randn(1, 4, 4, 4)),
     RuntimeError, "Padding size should be less than the corresponding input dimension"),
    (lambda: F.max_pool2d(distgrad.randn(2, 3, 8, 8), 2, padding=2), RuntimeError,
     "pad should be at most half of effective kernel size"),
    (lambda: F.max_pool2d(distgrad.randn(1, 1, 2, 2), 3), RuntimeError, "Output size is too small"),
    (lambda: F.max_pool2d(distgrad.randn(8), 2), RuntimeError, "3D or 4D"),
    (lambda: F.max_pool2d(distgrad.randn(1, 1, 4, 4), (2, 2, 2)), RuntimeError,
     "kernel_size must either be a single int, or a tuple of two ints"),
    (lambda: F.max_pool2d(distgrad.randn(1, 1, 4, 4), 2, stride=0), RuntimeError,
     "stride should not be zero"),
    (lambda: F.max_pool1d(distgrad.randn(1, 1, 8, 8), 2), RuntimeError,
     "max_pool1d: Expected 2D or 3D"),
    (lambda: F.avg_pool2d(distgrad.randn(1, 1, 4, 4), 2, divisor_override=0), RuntimeError,
     "divisor must be not zero"),
    (lambda: F.avg_pool1d(distgrad.randn(1, 1, 8, 8), 2), RuntimeError,
     "while checking arguments for avg_pool1d"),
    (lambda: F.adaptive_avg_pool2d(distgrad.randn(8), 2), RuntimeError, "Expected 3D or 4D"),
    (lambda: F.adaptive_avg_pool2d(distgrad.randn(1, 1, 4, 4), (2, 2, 2)), RuntimeError,
     "output_size must be 2"),
    (lambda: F.adaptive_avg_pool2d(distgrad.randn(1, 1, 4, 4), -1), RuntimeError,
     "greater than or equal to 0"),
])
def test_errors_name_the_fault(call, exc, match):
    with pytest.raises(exc, match=match):
        call()


@needs_torch
@pytest.mark.parametrize("call", [
    lambda m: m.nn.functional.conv2d(m.randn(2, 3, 8), m.randn(4, 3, 3, 3)),
    lambda m: m.nn.functional.conv2d(m.randn(2, 4, 8, 8), m.randn(3, 2, 3, 3), groups=2),
    lambda m: m.nn.Conv2d(3, 4, 3, groups=2),
    lambda m: m.nn.functional.max_pool2d(m.randn(1, 1, 2, 2), 3),
    lambda m: m.nn.functional.avg_pool2d(m.randn(1, 1, 4, 4), 2, divisor_override=0),
])
def test_error_classes_equal_torchs(call):
    with pytest.raises(Exception) as theirs:
        call(torch)
    with pytest.raises(Exception) as ours:
        call(distgrad)
    assert type(ours.value) is type(theirs.value)

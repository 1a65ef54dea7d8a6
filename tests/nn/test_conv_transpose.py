"""Transposed convolutions against PyTorch: values, gradients (of any order), the layers'
parameters, output_size, initialisation and errors."""
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

CASES = [
    ("2d", lambda m: m.ConvTranspose2d(3, 4, 3), (2, 3, 5, 4)),
    ("2d-strided", lambda m: m.ConvTranspose2d(4, 6, (3, 2), stride=(2, 3), padding=(1, 0),
                                               output_padding=(1, 2), groups=2), (2, 4, 4, 5)),
    ("2d-dilated", lambda m: m.ConvTranspose2d(2, 3, 3, padding=2, dilation=2, bias=False),
     (1, 2, 6, 5)),
    ("2d-output-padding-by-dilation", lambda m: m.ConvTranspose2d(2, 2, 2, dilation=3,
                                                                  output_padding=2), (1, 2, 3, 3)),
    ("2d-output-padding-past-padding", lambda m: m.ConvTranspose2d(2, 3, 3, stride=3, padding=1,
                                                                   output_padding=2),
     (2, 2, 3, 2)),
    ("2d-depthwise", lambda m: m.ConvTranspose2d(4, 4, 3, stride=2, padding=1, groups=4),
     (2, 4, 3, 3)),
    ("2d-unbatched", lambda m: m.ConvTranspose2d(3, 2, 2, stride=2), (3, 4, 3)),
    ("1d", lambda m: m.ConvTranspose1d(3, 5, 3, stride=2, padding=1, output_padding=1),
     (2, 3, 6)),
    ("1d-groups-dilated", lambda m: m.ConvTranspose1d(4, 2, 2, dilation=3, groups=2), (2, 4, 5)),
    ("1d-unbatched", lambda m: m.ConvTranspose1d(2, 3, 4, bias=False), (2, 7)),
]


@needs_torch
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("name,build,shape", CASES, ids=[c[0] for c in CASES])
def test_layer_matches_torch(name, build, shape, dtype):
    assert_pairs_close(run_both(build, [shape], dtype), dtype)


@needs_torch
@pytest.mark.parametrize("name,build,shape", CASES, ids=[c[0] for c in CASES])
def test_parameters_state_dict_and_repr(name, build, shape):
    ours, theirs = build(nn), build(torch.nn)
    assert list(ours.state_dict()) == list(theirs.state_dict())
    assert [tuple(p.shape) for p in ours.parameters()] == \
        [tuple(p.shape) for p in theirs.parameters()]
    assert repr(ours) == repr(theirs)
    for attr in ("kernel_size", "stride", "padding", "dilation", "groups", "output_padding",
                 "transposed", "padding_mode"):
        assert getattr(ours, attr) == getattr(theirs, attr), attr


@needs_torch
def test_output_size_picks_the_output_padding():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((1, 4, 5, 5)).astype(np.float32)
    for size in ([9, 9], [10, 10], (1, 2, 10, 9)):
        shapes = []
        for m, t in ((nn, distgrad.tensor(x)), (torch.nn, torch.tensor(x))):
            layer = m.ConvTranspose2d(4, 2, 3, stride=2, padding=1)
            shapes.append(tuple(layer(t, output_size=size).shape))
        assert shapes[0] == shapes[1]
    for m, t in ((nn, distgrad.tensor(x)), (torch.nn, torch.tensor(x))):
        with pytest.raises(ValueError, match="valid sizes range from"):
            m.ConvTranspose2d(4, 2, 3, stride=2, padding=1)(t, output_size=[12, 12])


def test_grad_fn_and_gradients_of_any_order():
    def dbl(*shape, seed=0):
        return distgrad.tensor(np.random.default_rng(seed).standard_normal(shape),
                               requires_grad=True)
    x, w, b = dbl(1, 2, 3, 4), dbl(2, 1, 2, 3, seed=1), dbl(2, seed=2)
    y = F.conv_transpose2d(x, w, b, stride=(2, 1), padding=(0, 1), groups=2)
    assert type(y.grad_fn).__name__ == "ConvolutionBackward0"
    fn = lambda x, w, b: F.conv_transpose2d(x, w, b, stride=2, output_padding=1,  # noqa: E731
                                            groups=2)
    assert gradcheck(fn, (x, w, b))
    assert gradgradcheck(lambda x, w: F.conv_transpose2d(x, w, stride=2, dilation=(1, 2),
                                                         output_padding=1),
                         (dbl(1, 1, 2, 3), dbl(1, 2, 2, 2, seed=3)))
    assert gradgradcheck(lambda x, w: F.conv_transpose1d(x, w, padding=1),
                         (dbl(1, 2, 4), dbl(2, 1, 3, seed=4)))


def test_default_init_bounds():
    distgrad.manual_seed(0)
    layer = nn.ConvTranspose2d(8, 16, 5)
    fan_in = 16 * 25  # PyTorch's fan-in of an (in, out, kH, kW) weight counts dim 1
    bound = 1 / math.sqrt(fan_in)
    w, b = layer.weight.detach().numpy(), layer.bias.detach().numpy()
    assert w.shape == (8, 16, 5, 5)
    assert 0.95 * bound < np.abs(w).max() <= bound
    assert 0.5 * bound < np.abs(b).max() <= bound


@pytest.mark.parametrize("call,exc,match", [
    (lambda m: m.nn.functional.conv_transpose2d(m.ones(1, 3, 4, 4), m.ones(2, 2, 3, 3)),
     RuntimeError, "expected input.* to have 2 channels, but got 3 channels"),
    (lambda m: m.nn.functional.conv_transpose2d(m.ones(1, 2, 4, 4), m.ones(2, 2, 3, 3),
                                                output_padding=1),
     RuntimeError, "output padding must be smaller than either stride or dilation"),
    (lambda m: m.nn.functional.conv_transpose1d(m.ones(1, 2, 4), m.ones(2, 2, 3), m.ones(3)),
     RuntimeError, "bias"),
    (lambda m: m.nn.functional.conv_transpose2d(m.ones(3, 4, 4), m.ones(2, 2, 3, 3)),
     RuntimeError, "channels"),
    (lambda m: m.nn.ConvTranspose2d(2, 2, 3, padding_mode="reflect"), ValueError,
     "padding mode is supported"),
])
def test_errors_are_pytorchs(call, exc, match):
    for m in [distgrad] + ([torch] if torch is not None else []):
        with pytest.raises(exc, match=match):
            call(m)

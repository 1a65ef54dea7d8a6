"""The fused layer norm (ops/layer_norm.py): PyTorch's values, gradients and node, and
gradients of gradients."""
import numpy as np
import pytest

import distgrad
from distgrad.autograd import gradcheck, gradgradcheck

CASES = [((3, 4), (4,), True), ((2, 3, 4), (3, 4), False), ((2, 5, 8), (8,), True),
         ((4,), (4,), True)]


@pytest.mark.parametrize("shape, normalized, affine", CASES)
def test_matches_torch(shape, normalized, affine):
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(0)
    x, g = (rng.standard_normal(shape).astype(np.float32) * 3 + 1 for _ in range(2))
    w, b = (rng.standard_normal(normalized).astype(np.float32) for _ in range(2))
    results = []
    for lib in (distgrad, torch):
        tx, tw, tb = (lib.tensor(a, requires_grad=True) for a in (x, w, b))
        y = lib.nn.functional.layer_norm(tx, normalized, tw if affine else None,
                                         tb if affine else None)
        y.backward(lib.tensor(g))
        grads = [tx.grad] + ([tw.grad, tb.grad] if affine else [])
        results.append((type(y.grad_fn).__name__, [y.detach().numpy()] +
                        [t.numpy() for t in grads]))
    assert results[0][0] == results[1][0] == "NativeLayerNormBackward0"
    for ours, theirs in zip(results[0][1], results[1][1]):
        np.testing.assert_allclose(ours, theirs, rtol=1e-5, atol=2e-5)


def test_gradients_and_gradients_of_gradients():
    x = distgrad.randn(3, 4, dtype=distgrad.float64, requires_grad=True)
    w = distgrad.randn(4, dtype=distgrad.float64, requires_grad=True)
    b = distgrad.randn(4, dtype=distgrad.float64, requires_grad=True)

    def fn(x, w, b):
        return distgrad.nn.functional.layer_norm(x, (4,), w, b)
    assert gradcheck(fn, (x, w, b))
    assert gradgradcheck(fn, (x, w, b))


def test_an_input_changed_in_place_after_the_forward_is_refused():
    x = distgrad.randn(2, 4, requires_grad=True)
    h = x * 1
    y = distgrad.nn.functional.layer_norm(h, (4,), distgrad.ones(4), distgrad.zeros(4))
    with distgrad.no_grad():
        h.add_(1)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        y.sum().backward()


@pytest.mark.parametrize("weight_shape, bias_shape, name", [((3,), (4,), "weight"),
                                                            ((4,), (2,), "bias"),
                                                            ((1, 4), (4,), "weight")])
def test_parameters_of_another_shape_raise_as_pytorch(weight_shape, bias_shape, name):
    with pytest.raises(RuntimeError, match=f"Expected {name} to be of same shape as "
                                           "normalized_shape"):
        distgrad.nn.functional.layer_norm(distgrad.ones(2, 4), (4,), distgrad.ones(*weight_shape),
                                          distgrad.ones(*bias_shape))

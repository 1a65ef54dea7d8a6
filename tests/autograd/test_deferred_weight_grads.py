"""``defer_weight_grads``: linear weights' gradients in one product per weight, later.

What it must keep: the same gradients as passes that compute them at once (up to the
order of a sum), nothing deferred where a result would change (hooks, ``inputs=``,
``create_graph``), the same bits whatever order the passes ran in, and nothing lost.
"""
import numpy as np
import pytest

import distgrad as dg
from distgrad import nn
from distgrad.autograd import defer_weight_grads


def _model():
    dg.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))


def _micro_batches(n=3, rows=5):
    dg.manual_seed(1)
    return [dg.randn(rows, 8) for _ in range(n)]


def _grads(model):
    return [None if p.grad is None else p.grad.numpy().copy() for p in model.parameters()]


def _train(model, xs, deferral=None):
    for p in model.parameters():
        p.grad = None
    for x in xs:
        model(x).pow(2).sum().backward()
        if deferral is not None:  # nothing reaches a deferred weight before the flush
            assert all(model[i].weight.grad is None for i in (0, 2))
            assert model[0].bias.grad is not None
    return _grads(model)


def test_deferred_gradients_equal_the_ones_computed_at_once():
    model, xs = _model(), _micro_batches()
    at_once = _train(model, xs)
    with defer_weight_grads([model[0].weight, model[2].weight]) as deferral:
        later = _train(model, xs, deferral)
        assert deferral.pending() == 6
    assert deferral.pending() == 0
    for a, b in zip(at_once, _grads(model)):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    assert later[0] is None  # read inside: not there yet


def test_one_product_over_the_rows_in_forward_order():
    model, xs = _model(), _micro_batches()
    with defer_weight_grads([model[2].weight]):
        _train(model, xs)
    whole = _model()
    # the same product the flush makes: all rows at once
    whole[2].weight.grad = None
    h = [whole[1](whole[0](x)) for x in xs]
    g = [2 * whole[2](hi) for hi in h]
    expected = np.concatenate([gi.detach().numpy() for gi in g]).T @ \
        np.concatenate([hi.detach().numpy() for hi in h])
    np.testing.assert_array_equal(model[2].weight.grad.numpy(), expected)


def test_the_same_bits_whatever_order_the_passes_ran_in():
    model, xs = _model(), _micro_batches()
    with defer_weight_grads([model[0].weight]):
        losses = [model(x).pow(2).sum() for x in xs]
        for loss in reversed(losses):  # backward in the opposite order
            loss.backward()
    reversed_order = model[0].weight.grad.numpy().copy()
    with defer_weight_grads([model[0].weight]):
        _train(model, xs)
    np.testing.assert_array_equal(model[0].weight.grad.numpy(), reversed_order)


def test_a_weight_with_a_hook_is_computed_at_once():
    model, xs = _model(), _micro_batches()
    seen = []
    model[0].weight.register_hook(lambda g: seen.append(g.shape))
    with defer_weight_grads([model[0].weight, model[2].weight]) as deferral:
        model(xs[0]).sum().backward()
        assert model[0].weight.grad is not None and model[2].weight.grad is None
        assert deferral.pending() == 1
    assert seen == [(16, 8)] and model[2].weight.grad is not None


def test_autograd_grad_and_create_graph_are_never_deferred():
    model, xs = _model(), _micro_batches(1)
    with defer_weight_grads([model[0].weight]) as deferral:
        (g,) = dg.autograd.grad(model(xs[0]).sum(), [model[0].weight])
        assert g.shape == (16, 8)
        model(xs[0]).sum().backward(create_graph=True)
        assert model[0].weight.grad is not None and deferral.pending() == 0


def test_a_failed_block_drops_what_it_kept():
    model, xs = _model(), _micro_batches(1)
    with pytest.raises(ZeroDivisionError):
        with defer_weight_grads([model[0].weight]):
            model(xs[0]).sum().backward()
            1 / 0
    assert model[0].weight.grad is None
    model(xs[0]).sum().backward()  # no longer deferred
    assert model[0].weight.grad is not None


def test_three_dimensional_inputs():
    dg.manual_seed(0)
    layer = nn.Linear(4, 3)
    x = dg.randn(2, 5, 4)
    layer(x).pow(2).sum().backward()
    at_once = layer.weight.grad.numpy().copy()
    layer.weight.grad = None
    with defer_weight_grads([layer.weight]):
        layer(x).pow(2).sum().backward()
    np.testing.assert_allclose(layer.weight.grad.numpy(), at_once, rtol=1e-5, atol=1e-6)


def test_bad_arguments_are_named():
    model = _model()
    with pytest.raises(ValueError, match=r"shape \(16, 8\) that is not a leaf"):
        defer_weight_grads([model[0].weight * 2])
    with pytest.raises(ValueError, match="does not require grad"):
        defer_weight_grads([dg.zeros(3)])
    with defer_weight_grads([model[0].weight]):
        with pytest.raises(RuntimeError, match=r"shape \(16, 8\) is already deferred"):
            defer_weight_grads([model[0].weight]).activate()

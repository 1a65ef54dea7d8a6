"""Custom autograd Functions: ctx API, naming, saved tensors, dirty and non-differentiable outputs."""
import numpy as np
import pytest

import distgrad
from distgrad.autograd import Function, once_differentiable
from distgrad.testing.oracle import torch


class Exp(Function):
    @staticmethod
    def forward(ctx, x):
        y = x.exp()
        ctx.save_for_backward(y)
        return y

    @staticmethod
    def backward(ctx, grad):
        (y,) = ctx.saved_tensors
        return grad * y


class MulConst(Function):
    @staticmethod
    def forward(ctx, x, k):
        ctx.k = k
        return x * k

    @staticmethod
    def backward(ctx, grad):
        return grad * ctx.k, None


def test_custom_function_gradient_and_name():
    x = distgrad.tensor([0.0, 1.0], dtype=distgrad.float64, requires_grad=True)
    y = Exp.apply(x)
    assert type(y.grad_fn).__name__ == "ExpBackward"
    assert y.grad_fn.next_functions[0][0].variable is x
    y.sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), np.exp([0.0, 1.0]))


def test_non_tensor_arguments_and_needs_input_grad():
    seen = {}

    class Probe(Function):
        @staticmethod
        def forward(ctx, a, k, b):
            seen["needs"] = ctx.needs_input_grad
            return a * k + b

        @staticmethod
        def backward(ctx, g):
            return g * 2, None, None

    a = distgrad.ones(2, requires_grad=True)
    b = distgrad.ones(2)
    Probe.apply(a, 2, b).sum().backward()
    assert seen["needs"] == (True, False, False)
    assert a.grad.tolist() == [2.0, 2.0]


def test_wrong_number_of_gradients_raises():
    class Bad(Function):
        @staticmethod
        def forward(ctx, a, b):
            return a + b

        @staticmethod
        def backward(ctx, g):
            return g

    a = distgrad.ones(1, requires_grad=True)
    with pytest.raises(RuntimeError, match="returned an incorrect number of gradients"):
        Bad.apply(a, a).sum().backward()


def test_saved_tensors_checked_against_versions():
    x = distgrad.ones(2, requires_grad=True)
    h = x * 1
    y = Exp.apply(h)
    y.add_(1)  # the output Exp saved is modified in place
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        y.sum().backward()


def test_saved_tensors_released_after_backward():
    x = distgrad.ones(2, requires_grad=True)
    y = Exp.apply(x)
    y.sum().backward()
    with pytest.raises(RuntimeError, match="retain_graph=True"):
        y.grad_fn.saved_tensors


def test_mark_dirty_rebases_history():
    class AddOneInplace(Function):
        @staticmethod
        def forward(ctx, x):
            x.add_(1)
            ctx.mark_dirty(x)
            return x

        @staticmethod
        def backward(ctx, g):
            return g * 3  # deliberately not the identity, to see it was used

    a = distgrad.ones(2, requires_grad=True)
    h = a * 1
    out = AddOneInplace.apply(h)
    assert out is h and h.tolist() == [2.0, 2.0]
    assert type(h.grad_fn).__name__ == "AddOneInplaceBackward"
    h.sum().backward()
    assert a.grad.tolist() == [3.0, 3.0]
    leaf = distgrad.ones(1, requires_grad=True)
    with pytest.raises(RuntimeError, match="leaf Variable that requires grad"):
        AddOneInplace.apply(leaf)


def test_mark_non_differentiable_and_materialize_grads():
    calls = {}

    class SortWithIndex(Function):
        @staticmethod
        def forward(ctx, x):
            order = np.argsort(x.detach().numpy())
            idx = distgrad.tensor(order)
            ctx.mark_non_differentiable(idx)
            ctx.save_for_backward(idx)
            return x[idx], idx

        @staticmethod
        def backward(ctx, g, g_idx):
            calls["g_idx"] = g_idx
            (idx,) = ctx.saved_tensors
            out = distgrad.zeros_like(g)
            out[idx] = g
            return out

    x = distgrad.tensor([3.0, 1.0, 2.0], requires_grad=True)
    vals, idx = SortWithIndex.apply(x)
    assert not idx.requires_grad and vals.requires_grad
    (vals * distgrad.tensor([1.0, 2.0, 3.0])).sum().backward()
    assert x.grad.tolist() == [3.0, 1.0, 2.0]
    assert calls["g_idx"].tolist() == [0, 0, 0]  # materialized zeros

    class NoMaterialize(Function):
        @staticmethod
        def forward(ctx, x):
            ctx.set_materialize_grads(False)
            return x * 1, x * 2

        @staticmethod
        def backward(ctx, g1, g2):
            calls["g2"] = g2
            return g1

    y1, _ = NoMaterialize.apply(x)
    y1.sum().backward()
    assert calls["g2"] is None


def test_setup_context_style():
    class Square(Function):
        @staticmethod
        def forward(x):
            return x * x

        @staticmethod
        def setup_context(ctx, inputs, output):
            (x,) = inputs
            ctx.save_for_backward(x)

        @staticmethod
        def backward(ctx, g):
            (x,) = ctx.saved_tensors
            return 2 * x * g

    x = distgrad.tensor([3.0], requires_grad=True)
    Square.apply(x).backward()
    assert x.grad.tolist() == [6.0]


def test_custom_function_double_backward_and_once_differentiable():
    x = distgrad.tensor([0.5], dtype=distgrad.float64, requires_grad=True)
    (g,) = distgrad.autograd.grad(Exp.apply(x), x, create_graph=True)
    (gg,) = distgrad.autograd.grad(g, x)
    np.testing.assert_allclose(gg.numpy(), np.exp([0.5]))

    class Once(Function):
        @staticmethod
        def forward(ctx, x):
            ctx.save_for_backward(x)
            return x * x

        @staticmethod
        @once_differentiable
        def backward(ctx, g):
            (x,) = ctx.saved_tensors
            return 2 * x * g

    y = Once.apply(x)
    (g1,) = distgrad.autograd.grad(y, x)
    np.testing.assert_allclose(g1.numpy(), [1.0])
    g_out = distgrad.ones(1, dtype=distgrad.float64, requires_grad=True)
    (g2,) = distgrad.autograd.grad(Once.apply(x), x, g_out, create_graph=True)
    assert g2.requires_grad
    with pytest.raises(RuntimeError, match="once_differentiable"):
        g2.sum().backward()


def test_gradcheck_on_custom_function():
    x = distgrad.randn(4, dtype=distgrad.float64, requires_grad=True)
    assert distgrad.autograd.gradcheck(Exp.apply, (x,))
    assert distgrad.autograd.gradcheck(lambda t: MulConst.apply(t, 3.0), (x,))


def test_gradcheck_detects_wrong_gradient():
    class Wrong(Function):
        @staticmethod
        def forward(ctx, x):
            return x * x

        @staticmethod
        def backward(ctx, g):
            return g  # should be 2x g

    x = distgrad.randn(3, dtype=distgrad.float64, requires_grad=True)
    with pytest.raises(distgrad.autograd.GradcheckError, match="Jacobian mismatch"):
        distgrad.autograd.gradcheck(Wrong.apply, (x,))
    assert distgrad.autograd.gradcheck(Wrong.apply, (x,), raise_exception=False) is False


def test_gradcheck_complex():
    z = distgrad.randn(3, dtype=distgrad.complex128, requires_grad=True)
    assert distgrad.autograd.gradcheck(lambda t: (t * t.conj()).real.sum() + t.exp().abs(), (z,))
    assert distgrad.autograd.gradcheck(lambda t: t * t, (z,))

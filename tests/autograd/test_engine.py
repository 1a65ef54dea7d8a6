"""backward / grad: API, retain_graph and graph freeing, inputs=, higher order, memory."""
import gc
import weakref

import numpy as np
import pytest

import distgrad
from distgrad.testing.oracle import torch

needs_torch = pytest.mark.skipif(torch is None, reason="PyTorch (the oracle) is not installed")


def leaf(*values, dtype=distgrad.float64):
    return distgrad.tensor(list(values), dtype=dtype, requires_grad=True)


def test_backward_accumulates_into_leaves_only():
    x = leaf(1.0, 2.0)
    y = x * 3
    z = (y * y).sum()
    z.backward()
    np.testing.assert_allclose(x.grad.numpy(), [18.0, 36.0])
    with pytest.warns(UserWarning, match="not a leaf"):
        assert y.grad is None
    z2 = (x * 3).sum()
    z2.backward()
    np.testing.assert_allclose(x.grad.numpy(), [21.0, 39.0])


def test_implicit_gradient_only_for_scalars():
    x = leaf(1.0, 2.0)
    with pytest.raises(RuntimeError, match="grad can be implicitly created only for scalar outputs"):
        (x * 2).backward()
    with pytest.raises(RuntimeError, match="does not require grad and does not have a grad_fn"):
        distgrad.ones(2).sum().backward()


def test_gradient_argument_shape_mismatch_names_shapes():
    x = leaf(1.0, 2.0)
    with pytest.raises(RuntimeError, match=r"Mismatch in shape: grad_output\[0\] has a shape of "
                                           r"distgrad.Size\(\[3\]\)"):
        (x * 2).backward(distgrad.ones(3, dtype=distgrad.float64))


def test_second_backward_through_freed_graph_raises_with_hint():
    x = leaf(1.0, 2.0)
    y = (x.exp() * x).sum()
    y.backward()
    with pytest.raises(RuntimeError, match="retain_graph=True"):
        y.backward()


def test_retain_graph_allows_repeated_backward_and_accumulates():
    x = leaf(1.0, 2.0)
    y = (x * x).sum()
    y.backward(retain_graph=True)
    y.backward()
    np.testing.assert_allclose(x.grad.numpy(), [4.0, 8.0])


def test_graph_that_saved_nothing_can_be_walked_again():
    x = leaf(1.0, 2.0)
    y = (x + 1).sum()  # AddBackward and SumBackward save no tensors
    y.backward()
    y.backward()
    np.testing.assert_allclose(x.grad.numpy(), [2.0, 2.0])


def test_saved_tensor_access_after_release_raises():
    x = leaf(1.0, 2.0)
    y = x * x
    y.sum().backward()
    with pytest.raises(RuntimeError, match="backward through the graph a second time"):
        y.grad_fn._saved_self


def test_graph_memory_is_freed_without_backward_and_without_gc():
    x = leaf(1.0, 2.0)
    big = distgrad.randn(1000, dtype=distgrad.float64)
    y = (x.sum() * big).tanh()  # TanhBackward saves its result, MulBackward saves `big`
    out_ref = weakref.ref(y)
    node_ref = weakref.ref(y.grad_fn)
    big_ref = weakref.ref(big)
    del big
    gc.disable()
    try:
        del y
        assert out_ref() is None and node_ref() is None and big_ref() is None
    finally:
        gc.enable()


def test_graph_memory_is_freed_after_backward():
    x = leaf(1.0, 2.0)
    y = x.exp().sum()
    ref = weakref.ref(y.grad_fn)
    y.backward()
    gc.disable()
    try:
        del y
        assert ref() is None
    finally:
        gc.enable()


def test_deep_chain_does_not_recurse():
    x = leaf(1.0)
    y = x
    for _ in range(10_000):
        y = y * 1.0001
    y.sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), [1.0001 ** 10_000], rtol=1e-9)
    del y  # freeing a 10,000-node chain must not recurse either


def test_grad_returns_without_touching_dot_grad():
    x = leaf(1.0, 2.0)
    y = (x ** 3).sum()
    (g,) = distgrad.autograd.grad(y, x)
    np.testing.assert_allclose(g.numpy(), [3.0, 12.0])
    assert x.grad is None


def test_grad_allow_unused_and_materialize():
    x, z = leaf(1.0), leaf(2.0)
    y = (x * 2).sum()
    with pytest.raises(RuntimeError, match="appears to not have been used in the graph"):
        distgrad.autograd.grad(y, [x, z], retain_graph=True)
    gx, gz = distgrad.autograd.grad(y, [x, z], allow_unused=True, retain_graph=True)
    assert gz is None
    gx, gz = distgrad.autograd.grad(y, [x, z], materialize_grads=True)
    assert gz.tolist() == [0.0]


def test_grad_of_input_that_does_not_require_grad_raises():
    x = leaf(1.0)
    with pytest.raises(RuntimeError, match="does not require grad"):
        distgrad.autograd.grad((x * 2).sum(), distgrad.ones(1))


def test_grad_with_respect_to_non_leaf():
    x = leaf(1.0, 2.0)
    h = x * 2
    y = (h * h).sum()
    (gh,) = distgrad.autograd.grad(y, h)
    np.testing.assert_allclose(gh.numpy(), [4.0, 8.0])


def test_backward_inputs_restricts_accumulation():
    x, w = leaf(1.0, 2.0), leaf(3.0, 4.0)
    (x * w).sum().backward(inputs=[w])
    assert x.grad is None
    np.testing.assert_allclose(w.grad.numpy(), [1.0, 2.0])
    with pytest.raises(RuntimeError, match="cannot be empty"):
        (x * w).sum().backward(inputs=[])


def test_backward_inputs_non_leaf_populates_grad():
    x = leaf(1.0, 2.0)
    h = x * 2
    (h * h).sum().backward(inputs=[h])
    np.testing.assert_allclose(h.grad.numpy(), [4.0, 8.0])
    assert x.grad is None


def test_create_graph_gives_higher_order_gradients():
    x = leaf(0.5, -1.0)
    y = (x.tanh() * x.exp()).sum()
    (g,) = distgrad.autograd.grad(y, x, create_graph=True)
    (gg,) = distgrad.autograd.grad(g.sum(), x, create_graph=True)
    (ggg,) = distgrad.autograd.grad(gg.sum(), x)
    xv = np.array([0.5, -1.0])

    def f(v):
        return np.tanh(v) * np.exp(v)
    eps = 1e-4
    d2 = (f(xv + eps) - 2 * f(xv) + f(xv - eps)) / eps ** 2
    np.testing.assert_allclose(gg.detach().numpy(), d2, rtol=1e-5)
    d3 = (f(xv + 2 * eps) - 2 * f(xv + eps) + 2 * f(xv - eps) - f(xv - 2 * eps)) / (2 * eps ** 3)
    np.testing.assert_allclose(ggg.numpy(), d3, rtol=1e-3)


def test_backward_create_graph_keeps_graph_of_dot_grad():
    x = leaf(2.0)
    (x ** 3).sum().backward(create_graph=True)
    assert x.grad.requires_grad
    (g2,) = distgrad.autograd.grad(x.grad.sum(), x)
    np.testing.assert_allclose(g2.numpy(), [12.0])


@needs_torch
@pytest.mark.parametrize("fn", [
    lambda m, a, b: ((a @ b).tanh() * a.sum()).logsumexp(1),
    lambda m, a, b: m.softmax(a @ b, 1).pow(2).sum(0),
    lambda m, a, b: (a.unsqueeze(-1) * b).amax(1).sigmoid(),
    lambda m, a, b: m.cat([a, b.t()], 0).var(0).sqrt(),
    lambda m, a, b: (a[[0, 0, 1]] ** 2).max(1)[0] * b.sum(),
])
def test_second_order_matches_torch(fn):
    rng = np.random.default_rng(3)
    a_np, b_np = rng.standard_normal((3, 4)), rng.standard_normal((4, 3))
    results = []
    for m in (distgrad, torch):
        a = m.tensor(a_np, requires_grad=True)
        b = m.tensor(b_np, requires_grad=True)
        out = fn(m, a, b).sum()
        ga, gb = m.autograd.grad(out, [a, b], create_graph=True)
        total = (ga * ga).sum() + (gb.sin()).sum()
        total.backward()
        results.append((a.grad.detach().numpy().copy(), b.grad.detach().numpy().copy()))
    for d, t in zip(results[0], results[1]):
        np.testing.assert_allclose(d, t, rtol=1e-6, atol=1e-8)


def test_gradgradcheck_on_composites():
    a = distgrad.randn(3, 4, dtype=distgrad.float64, requires_grad=True)
    w = distgrad.randn(4, 2, dtype=distgrad.float64, requires_grad=True)
    assert distgrad.autograd.gradgradcheck(lambda a, w: (a @ w).tanh().logsumexp(0), (a, w))
    assert distgrad.autograd.gradgradcheck(
        lambda a: distgrad.nn.functional.layer_norm(a, (4,)), (a,))


def test_multiple_roots_and_shared_subgraph():
    x = leaf(1.0, 2.0)
    h = x.exp()
    distgrad.autograd.backward([h.sum(), (h * h).sum()])
    e = np.exp([1.0, 2.0])
    np.testing.assert_allclose(x.grad.numpy(), e + 2 * e * e)


def test_dtype_of_gradient_matches_leaf():
    x = distgrad.ones(3, dtype=distgrad.float32, requires_grad=True)
    y = (x.to(distgrad.float64) * 2).sum()
    y.backward()
    assert x.grad.dtype == distgrad.float32


def test_user_gradient_is_never_aliased_by_dot_grad():
    x = leaf(1.0, 2.0)
    g = distgrad.ones(2, dtype=distgrad.float64)
    (x + 0).backward(g)
    x.grad.zero_()
    assert g.tolist() == [1.0, 1.0]
    a, b = leaf(1.0), leaf(1.0)
    (a + b).backward(distgrad.ones(1, dtype=distgrad.float64))
    a.grad.mul_(5)
    assert b.grad.tolist() == [1.0]


def _view_gradients_and_their_buffers(lib):
    def leaf(*values):
        return lib.tensor(values, dtype=lib.float64, requires_grad=True)
    out = []
    # reshape's backward hands the leaf a view of its incoming gradient: of the caller's
    # gradient here, which PyTorch keeps as .grad (the two share memory) ...
    x = leaf(1.0, 2.0, 3.0, 4.0)
    g = lib.ones(2, 2, dtype=lib.float64)
    x.reshape(2, 2).backward(g)
    x.grad.zero_()
    out.append(g.tolist())
    # ... of a fresh product here (kept: nothing else holds it)
    x.grad = None
    y = x.reshape(2, 2) * 3
    y.sum().backward()
    x.grad.add_(1)
    out.append((x.grad.tolist(), y.tolist()))
    a, b = leaf(1.0, 2.0), leaf(1.0, 2.0)
    (a.reshape(2, 1) * b.reshape(2, 1)).sum().backward()
    a.grad.mul_(10)
    out.append(b.grad.tolist())
    # both views of the caller's one gradient (through add): both leaves share it
    c, d = leaf(1.0, 2.0), leaf(1.0, 2.0)
    (c.reshape(2, 1) + d.reshape(2, 1)).backward(lib.ones(2, 1, dtype=lib.float64) * 2)
    c.grad.mul_(10)
    out.append((d.grad.tolist(), c.grad.tolist()))
    return out


def test_view_gradients_share_a_buffer_as_in_pytorch():
    out = _view_gradients_and_their_buffers(distgrad)
    assert out == [[[0.0, 0.0], [0.0, 0.0]], ([4.0] * 4, [[3.0, 6.0], [9.0, 12.0]]), [1.0, 2.0],
                   ([20.0, 20.0], [20.0, 20.0])]  # recorded from torch 2.13
    if torch is not None:
        assert out == _view_gradients_and_their_buffers(torch)


def test_a_fresh_gradient_becomes_dot_grad_without_a_copy():
    # PyTorch steals a gradient buffer nothing else holds; a copy would double the peak.
    import tracemalloc
    w = distgrad.zeros(1 << 20, dtype=distgrad.float32, requires_grad=True)
    loss = (w * 2).sum()
    tracemalloc.start()
    try:
        loss.backward()
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert w.grad.tolist()[:2] == [2.0, 2.0]
    assert peak < 1.5 * 4 * (1 << 20), peak  # one gradient buffer (4 MB), not two


def test_grad_fn_names_and_next_functions():
    x = leaf(1.0, 2.0)
    y = (x * 2).exp().sum()
    assert type(y.grad_fn).__name__ == "SumBackward0"
    exp_node = y.grad_fn.next_functions[0][0]
    assert exp_node.name() == "ExpBackward0"
    mul_node = exp_node.next_functions[0][0]
    assert mul_node.name() == "MulBackward0"
    acc = mul_node.next_functions[0][0]
    assert acc.name() == "AccumulateGrad" and acc.variable is x


@needs_torch
def test_grad_fn_names_match_torch():
    def names(m):
        x = m.tensor([[1.0, 2.0]], requires_grad=True)
        w = m.tensor([[1.0], [2.0]], requires_grad=True)
        outs = [x * w.t(), x + 1, x - x, x / 2, x ** 2, x.exp(), x.log(), x.tanh(), x.sigmoid(),
                x.relu(), x.sum(), x.mean(), x @ w, x.reshape(2), x.t(), x.unsqueeze(0),
                x.squeeze(0), x.permute(1, 0), x.transpose(0, 1), x[0], x[:, 1:],
                m.cat([x, x]), m.stack([x, x]), x.softmax(1), x.log_softmax(1), x.abs(),
                x.sqrt(), x.clone(), x.max(), x.amax(1), x.var(), x.std(), x.prod(), -x]
        return [type(o.grad_fn).__name__ for o in outs]
    assert names(distgrad) == names(torch)


@needs_torch
def test_next_functions_of_scalar_overloads_match_torch():
    exprs = ["x + 1", "1 + x", "x * 2", "2 * x", "x / 2", "2 / x", "2 - x", "x - 1", "x ** 2",
             "2 ** x"]

    def shapes(m):
        scope = {"x": m.tensor([1.0, 2.0], requires_grad=True)}
        return [[None if n is None else type(n).__name__
                 for n, _ in eval(e, scope).grad_fn.next_functions] for e in exprs]
    assert shapes(distgrad) == shapes(torch)


@needs_torch
@pytest.mark.parametrize("dim", [None, 0, 1])
def test_second_order_of_prod_with_zeros_matches_torch(dim):
    values = [[2.0, 0.0, 3.0], [0.0, 0.0, 1.0]] if dim != 0 else [[2.0, 0.0, 3.0], [0.5, 4.0, 1.0]]
    results = []
    for m in (distgrad, torch):
        x = m.tensor(values, dtype=m.float64, requires_grad=True)
        p = x.prod() if dim is None else x.prod(dim)
        (g,) = m.autograd.grad(p.sum(), x, create_graph=True)
        (gg,) = m.autograd.grad((g * g).sum(), x)
        results.append(gg.detach().numpy().copy())
    np.testing.assert_allclose(results[0], results[1])


@needs_torch
@pytest.mark.parametrize("fn", [lambda z: (z.abs() ** 3).sum(), lambda z: (z.angle() * z.abs()).sum(),
                                lambda z: (z * z.conj()).real.sum() * z.exp().abs().sum()])
def test_second_order_complex_matches_torch(fn):
    results = []
    for m in (distgrad, torch):
        z = m.tensor([1 + 2j, -0.5 + 0.3j, 0.7 - 1j], dtype=m.complex128, requires_grad=True)
        (g,) = m.autograd.grad(fn(z), z, create_graph=True)
        (gg,) = m.autograd.grad((g * g.conj()).real.sum(), z)
        results.append(gg.detach().numpy().copy())
    np.testing.assert_allclose(results[0], results[1], rtol=1e-10)


@needs_torch
@pytest.mark.parametrize("use_grad", [False, True])
def test_zero_dim_leaf_used_twice_gets_a_tensor_gradient(use_grad):
    # two 0-d gradients of one input summed by NumPy are a scalar, not an array
    def run(lib):
        e = lib.tensor(0.5, requires_grad=True)
        x = lib.linspace(-1, 1, 5)
        loss = (e * x ** 4 + e * x ** 5).sum() + e * e
        if use_grad:
            return lib.autograd.grad(loss, e)[0]
        loss.backward()
        return e.grad
    ours, theirs = run(distgrad), run(torch)
    assert isinstance(ours, distgrad.Tensor) and ours.shape == ()
    np.testing.assert_allclose(ours.numpy(), theirs.numpy(), rtol=1e-6)

"""In-place ops: version counters, PyTorch's errors, and correct gradients through them."""
import numpy as np
import pytest

import distgrad
from distgrad.testing.oracle import torch

needs_torch = pytest.mark.skipif(torch is None, reason="PyTorch (the oracle) is not installed")


def test_version_counter_bumps_and_is_shared_by_views():
    x = distgrad.zeros(3, 4)
    v = x[0]
    assert x._version == 0
    x.add_(1)
    assert x._version == 1 and v._version == 1
    v.mul_(2)
    assert x._version == 2
    assert x.detach()._version == 2  # detach shares the counter too
    assert x.data._version == 0      # .data does not


def test_leaf_requiring_grad_refuses_inplace():
    w = distgrad.ones(3, requires_grad=True)
    with pytest.raises(RuntimeError, match="a leaf Variable that requires grad is being used in an "
                                           "in-place operation"):
        w.add_(1)
    with pytest.raises(RuntimeError, match="a view of a leaf Variable"):
        w[0].mul_(2)
    with distgrad.no_grad():
        w.add_(1)  # optimizers do this
    assert w.tolist() == [2.0, 2.0, 2.0] and w.is_leaf


def test_modified_saved_tensor_is_detected():
    x = distgrad.ones(3, requires_grad=True)
    h = x * 2
    y = h.exp()       # saves its result
    z = (h * h).sum()  # saves h
    h.add_(1)
    with pytest.raises(RuntimeError, match=r"modified by an inplace operation.*is at version 1; "
                                           r"expected version 0"):
        z.backward()
    y.sum().backward()  # exp saved its own output, untouched: fine


def test_result_saved_then_modified_is_detected():
    x = distgrad.ones(3, requires_grad=True)
    y = (x * 1).exp()
    y.mul_(2)  # modifies exp's saved output... through mul_, which records fine
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        y.sum().backward()


@needs_torch
@pytest.mark.parametrize("body", [
    lambda m, a, b: (lambda h: (h.mul_(b), h.exp_(), h)[-1])(a * 2),
    lambda m, a, b: (lambda h: (h.add_(b, alpha=3), h.clamp_(-1, 1), h.sum())[-1])(a * 1),
    lambda m, a, b: (lambda h: (h.__setitem__((0,), b[0]), h)[-1])(a * 1),
    lambda m, a, b: (lambda h: (h.__setitem__((slice(None), 1), b[:, 0] * 2), h)[-1])(a.sin()),
    lambda m, a, b: (lambda h: (h[1:].mul_(b[1:]), h)[-1])(a * 1),
    lambda m, a, b: (lambda h: (h.t()[0].add_(b[0, 0]), h.sin())[-1])(a * 1),
    lambda m, a, b: (lambda h: (h.copy_(b), h * a)[-1])(a * 1),
    lambda m, a, b: (lambda h: (h.zero_(), h + a)[-1])(a * 1),
    lambda m, a, b: (lambda h: (h.masked_fill_(b > 0, 2.0), h * a)[-1])(a * 3),
    lambda m, a, b: (lambda z: (z.copy_(a), z[0].mul_(b[0]), z)[-1])(m.zeros(3, 3, dtype=m.float64)),
])
def test_gradients_through_inplace_match_torch(body):
    rng = np.random.default_rng(7)
    a_np, b_np = rng.standard_normal((3, 3)), rng.standard_normal((3, 3))
    grads = []
    for m in (distgrad, torch):
        a = m.tensor(a_np, requires_grad=True)
        b = m.tensor(b_np, requires_grad=True)
        out = body(m, a, b)
        (out * m.tensor(np.arange(out.numel(), dtype=np.float64).reshape(out.shape))).sum().backward()
        grads.append([None if t.grad is None else t.grad.numpy().copy() for t in (a, b)])
    for d, t in zip(grads[0], grads[1]):
        if t is None:
            assert d is None or not d.any()
        else:
            np.testing.assert_allclose(d, t, rtol=1e-7, atol=1e-10)


def test_setitem_on_leaf_without_grad_makes_graph():
    w = distgrad.tensor([1.0, 2.0], requires_grad=True)
    buf = distgrad.zeros(4)
    buf[1:3] = w * 2
    assert buf.requires_grad and not buf.is_leaf
    buf.sum().backward()
    assert w.grad.tolist() == [2.0, 2.0]


def test_inplace_dtype_errors_and_broadcast_views():
    x = distgrad.zeros(3, dtype=distgrad.int64)
    with pytest.raises(RuntimeError, match="result type Float can't be cast to the desired output "
                                           "type Long"):
        x.add_(distgrad.ones(3))
    e = distgrad.ones(1).expand(3)
    with pytest.raises(RuntimeError, match="more than one element of the written-to tensor"):
        e.add_(1)


def test_operators_iadd_and_friends_are_inplace():
    x = distgrad.ones(2)
    ref = x
    x += 1
    x *= 3
    x -= 1
    x /= 5
    assert x is ref and x.tolist() == [1.0, 1.0] and x._version == 4


def test_from_numpy_shares_memory_both_ways():
    arr = np.zeros(3, dtype=np.float32)
    t = distgrad.from_numpy(arr)
    t.add_(1)
    assert arr.tolist() == [1.0, 1.0, 1.0]
    arr[0] = 5
    assert t[0].item() == 5

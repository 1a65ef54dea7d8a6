"""Gradients with offloading are bit for bit those without: every tier, every policy,
retain_graph, views and transposes, in-place after save, custom Functions, double
backward."""
import gc

import numpy as np
import pytest

import distgrad
from distgrad.offload import (OffloadPolicy, save_on_disk, save_on_remote, save_tiered)

from offload_helpers import assert_bitwise_equal, fast_client, gradients, make_mlp

pytestmark = pytest.mark.timeout(60)

ALL = OffloadPolicy(min_bytes=0)


def _tiers(store_server, tmp_path):
    server = store_server(memory_bytes=3000)   # spills most blobs: the disk path too
    return {
        "disk": lambda: save_on_disk(tmp_path, policy=ALL),
        "disk-mmap": lambda: save_on_disk(tmp_path, policy=ALL, read="mmap"),
        "tiered-disk": lambda: save_tiered(2000, directory=tmp_path, policy=ALL),
        "remote": lambda: save_on_remote(fast_client(server.endpoint), policy=ALL),
        "tiered-remote": lambda: save_tiered(1500, store=fast_client(server.endpoint),
                                             policy=ALL),
        "no-prefetch": lambda: save_on_disk(tmp_path, policy=ALL, prefetch_bytes=0),
    }


@pytest.mark.parametrize("retain_graph", [False, True])
def test_every_tier_is_exact(store_server, tmp_path, retain_graph):
    want = gradients(make_mlp, retain_graph=retain_graph)
    for name, make in _tiers(store_server, tmp_path).items():
        hooks = make()
        got = gradients(make_mlp, hooks, retain_graph=retain_graph)
        assert_bitwise_equal(got, want)
        s = hooks.stats
        assert s.tensors_offloaded == 3 and s.tensors_deduplicated == 3, (name, s)
        assert s.prefetch_hits + s.prefetch_misses == (12 if retain_graph else 6), (name, s)
        hooks.flush()
        assert hooks.live_records() == 0, name
        hooks.close()


@pytest.mark.parametrize("policy", [
    OffloadPolicy(min_bytes=1 << 30),                                 # everything stays
    OffloadPolicy(min_bytes=0, exclude_modules=["4"]),                # keep the last layer
    OffloadPolicy(min_bytes=0, modules=["Tanh"]),                     # only inside Tanh
    OffloadPolicy(min_bytes=0, exclude_ops=["tanh"]),                 # not what tanh made
    OffloadPolicy(min_bytes=0, every_nth_layer=2),
    OffloadPolicy(min_bytes=0, every_nth_layer=2, layers=["Linear"]),
])
def test_every_policy_is_exact(tmp_path, policy):
    want = gradients(make_mlp)
    model = make_mlp()
    hooks = save_on_disk(tmp_path, policy=policy, model=model)
    got = gradients(lambda: model, hooks)
    assert_bitwise_equal(got, want)
    hooks.close()


def test_policies_choose_what_leaves(tmp_path):
    def offloaded(**kw):
        model = make_mlp(layers=4)
        with save_on_disk(tmp_path, policy=OffloadPolicy(**{"min_bytes": 0, **kw}), model=model) as h:
            model(distgrad.randn(4, 32)).sum()
        n = h.stats.tensors_offloaded + h.stats.tensors_deduplicated
        h.close()
        return n
    # 4 Tanh save their outputs; Linears 1-3 save those as inputs (Linear 0's is a leaf)
    assert offloaded() == 7
    assert offloaded(min_bytes=1 << 20) == 0
    assert offloaded(exclude_modules=["6", "7"]) == 5   # the last Linear and Tanh keep theirs
    assert offloaded(modules=["Linear"]) == 3
    assert offloaded(exclude_ops=["TanhBackward0"]) == 0  # all were made by tanh
    assert offloaded(every_nth_layer=2) == 3       # children 0, 2, 4, 6: the Linears


def test_parameters_and_leaves_are_never_offloaded(tmp_path):
    w = distgrad.nn.Parameter(distgrad.randn(16, 16))
    x = distgrad.randn(4, 16, requires_grad=True)

    def run(hooks):
        with hooks:
            y = (x @ w.t()).sum() + (w * w).sum()      # saves x, w.t() (a view of w), w, w
        y.backward()
        g = w.grad.numpy().copy()
        w.grad = None
        return g
    want = run(distgrad.autograd.graph.saved_tensors_hooks(lambda t: t, lambda t: t))
    hooks = save_on_disk(tmp_path, policy=ALL)
    assert np.array_equal(run(hooks), want)
    assert hooks.stats.tensors_offloaded == 0 and hooks.stats.tensors_kept == 4
    hooks.close()


def test_transpose_and_slice_share_one_record_with_their_own_layout(tmp_path):
    a = distgrad.randn(6, 6, requires_grad=True)

    def run(hooks):
        b = a * 2                       # a non-leaf: offloadable
        with hooks:
            y = (b @ b.t()).sum() + (b[1:4, ::2] * b.t()[::-1][2:5, ::2]).sum()
        (g,) = distgrad.autograd.grad(y, a)
        return g.numpy().copy()
    want = run(distgrad.autograd.graph.saved_tensors_hooks(lambda t: t, lambda t: t))
    hooks = save_on_disk(tmp_path, policy=ALL)
    got = run(hooks)
    assert np.array_equal(got, want)
    # b, b.t() and the two strided views all live in b's memory: stored once
    assert hooks.stats.tensors_offloaded == 1 and hooks.stats.tensors_deduplicated == 3
    hooks.close()


def test_a_new_array_at_a_freed_address_is_not_taken_for_the_old(tmp_path):
    hooks = save_on_disk(tmp_path, policy=ALL)
    x = distgrad.randn(64, requires_grad=True)
    with hooks:
        y1 = (x * 1).exp()              # saves its result
        addr = y1._data.ctypes.data
        l1 = y1.sum()
    del y1
    z = None
    for _ in range(50):                 # NumPy reuses the freed block sooner or later
        with hooks:
            z = (x * 3).exp()
            if z._data.ctypes.data == addr:
                break
    l2 = z.sum()
    (g1,) = distgrad.autograd.grad(l1, x)
    (g2,) = distgrad.autograd.grad(l2, x)
    assert np.array_equal(g1.numpy(), x.detach().exp().numpy())
    assert np.array_equal(g2.numpy(), (3 * (x.detach() * 3).exp()).numpy())
    hooks.close()


def test_in_place_after_save_still_raises(tmp_path):
    x = distgrad.randn(8, requires_grad=True)
    for hooks in (save_on_disk(tmp_path, policy=ALL), save_on_disk(tmp_path, min_bytes=1 << 20)):
        with hooks:
            y = (x * 1).exp()           # exp saves y
        y.add_(1)
        with pytest.raises(RuntimeError, match="modified by an inplace operation"):
            y.sum().backward()
        hooks.close()


def test_custom_function(tmp_path):
    class Cube(distgrad.autograd.Function):
        @staticmethod
        def forward(ctx, x, w):
            y = x * x * w
            ctx.save_for_backward(x, w, y)
            return y * x

        @staticmethod
        def backward(ctx, g):
            x, w, y = ctx.saved_tensors
            return g * 3 * y, g * x * x * x

    w = distgrad.nn.Parameter(distgrad.randn(16))

    def run(hooks):
        x = distgrad.randn(16, requires_grad=True, generator=None) * 1
        with hooks:
            out = Cube.apply(x.tanh(), w).sum()
        out.backward()
        g = w.grad.numpy().copy()
        w.grad = None
        return g
    distgrad.manual_seed(3)
    want = run(distgrad.autograd.graph.saved_tensors_hooks(lambda t: t, lambda t: t))
    distgrad.manual_seed(3)
    hooks = save_on_disk(tmp_path, policy=ALL)
    assert np.array_equal(run(hooks), want)
    assert hooks.stats.tensors_offloaded >= 1
    hooks.close()


def test_double_backward_through_offloaded_tensors(tmp_path):
    x = distgrad.tensor([0.3, -1.2, 2.5], dtype=distgrad.float64, requires_grad=True)

    def second(hooks):
        with hooks:
            y = (x.sin() * x.exp()).sum()
        (g,) = distgrad.autograd.grad(y, x, create_graph=True)
        (gg,) = distgrad.autograd.grad(g.sum(), x)
        return gg.numpy().copy()
    want = second(distgrad.autograd.graph.saved_tensors_hooks(lambda t: t, lambda t: t))
    hooks = save_on_disk(tmp_path, policy=ALL)
    assert np.array_equal(second(hooks), want)
    hooks.close()


def test_unpack_many_times_returns_the_same_data(tmp_path):
    x = distgrad.randn(32, requires_grad=True)
    with save_on_disk(tmp_path, policy=ALL) as hooks:
        y = (x * 2).exp()
    saved = [y.grad_fn._saved_result.detach().numpy().copy() for _ in range(3)]
    assert all(np.array_equal(s, y.detach().numpy()) for s in saved)
    with pytest.raises(ValueError):     # what comes back is read-only
        y.grad_fn._saved_result._data[0] = 0
    del y
    gc.collect()
    hooks.close()

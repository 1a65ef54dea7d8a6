"""``distgrad.utils.checkpoint`` against PyTorch's ``torch.utils.checkpoint``: the same
model and inputs give the same gradients as PyTorch's checkpoint, and gradients bit
for bit equal to distgrad without checkpointing; PyTorch's errors and warnings."""
import contextlib
import warnings

import numpy as np
import pytest

import distgrad
from distgrad.testing.oracle import torch
from distgrad.utils import checkpoint as dck

pytestmark = pytest.mark.timeout(60)
#: the libraries each behaviour is checked in: PyTorch too where it is installed
LIBS = [distgrad] + ([torch] if torch is not None else [])


def _arr(seed, shape):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


class Model:
    """Three tanh/sigmoid blocks with a dropout, the same weights in either library."""

    def __init__(self, lib, dropout=0.0):
        self.lib = lib
        self.ws = [lib.tensor(_arr(i + 1, (12, 12)) * 0.4, requires_grad=True) for i in range(6)]
        self.x = lib.tensor(_arr(0, (5, 12)), requires_grad=True)
        self.p = dropout

    def block(self, h, w1, w2):
        a = (h @ w1).tanh()
        if self.p:
            a = self.lib.nn.functional.dropout(a, self.p, training=True)
        return (a @ w2).sigmoid() * a

    def run(self, wrap):
        h = self.x
        for i in range(0, 6, 2):
            h = wrap(self.block, h, self.ws[i], self.ws[i + 1])
        h.pow(2).sum().backward()
        return [t.grad.numpy().copy() for t in [self.x] + self.ws]


def _plain(fn, *args):
    return fn(*args)


def _checkpointed(lib, **kw):
    return lambda fn, *args: lib.utils.checkpoint.checkpoint(fn, *args, **kw)


def _bit_equal(got, want):
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and (g == w).all()


def _close(got, want):
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("reentrant", [False, True])
def test_gradients_equal_pytorchs_checkpoint_and_bit_equal_without_it(reentrant):
    plain = Model(distgrad).run(_plain)
    ours = Model(distgrad).run(_checkpointed(distgrad, use_reentrant=reentrant))
    _bit_equal(ours, plain)
    if torch is None:
        pytest.skip("PyTorch is not installed: checked bit for bit against the plain run only")
    _close(ours, Model(torch).run(_checkpointed(torch, use_reentrant=reentrant)))


@pytest.mark.parametrize("reentrant", [False, True])
def test_dropout_replays_its_masks_unless_told_not_to(reentrant):
    distgrad.manual_seed(3)
    plain = Model(distgrad, dropout=0.3).run(_plain)
    distgrad.manual_seed(3)
    ours = Model(distgrad, dropout=0.3).run(_checkpointed(distgrad, use_reentrant=reentrant))
    _bit_equal(ours, plain)
    distgrad.manual_seed(3)
    loose = Model(distgrad, dropout=0.3).run(
        _checkpointed(distgrad, use_reentrant=reentrant, preserve_rng_state=False))
    assert not all((a == b).all() for a, b in zip(loose, plain))  # other masks in backward


def test_nested_checkpoints_rerun_outer_then_inner():
    results = []
    for lib in LIBS:
        ck = lib.utils.checkpoint.checkpoint
        m = Model(lib)
        calls = []

        def inner(h, w):
            calls.append("inner")
            return (h @ w).tanh()

        def outer(h, w1, w2):
            calls.append("outer")
            a = (h @ w1).sin()
            return ck(inner, a, w2, use_reentrant=False) * a

        grads = m.run(lambda fn, *args: ck(outer, *args, use_reentrant=False))
        results.append((calls, grads))
    # forward: each block's outer and inner; backward, per block: the outer rerun (which
    # calls the inner again, inside it), then the inner's own rerun
    assert results[0][0] == ["outer", "inner"] * 3 + ["outer", "inner", "inner"] * 3
    if torch is not None:
        assert results[1][0] == results[0][0]
        _close(results[0][1], results[1][1])


def test_autograd_grad_backward_inputs_and_double_backward_without_reentrant():
    out = []
    for lib in LIBS:
        m = Model(lib)
        ck = lib.utils.checkpoint.checkpoint
        y = ck(m.block, m.x, m.ws[0], m.ws[1], use_reentrant=False).pow(2).sum()
        (gx,) = lib.autograd.grad(y, m.x, create_graph=True)
        gx.sum().backward(inputs=[m.ws[0]])
        out.append([gx.detach().numpy().copy(), m.ws[0].grad.numpy().copy()])
    if torch is not None:
        _close(out[0], out[1])


@pytest.mark.parametrize("how", ["grad", "inputs"])
def test_reentrant_refuses_grad_and_backward_inputs(how):
    for lib in LIBS:
        m = Model(lib)
        y = lib.utils.checkpoint.checkpoint(m.block, m.x, m.ws[0], m.ws[1],
                                            use_reentrant=True).sum()
        with pytest.raises(RuntimeError, match="When use_reentrant=True, torch.utils.checkpoint "
                                               "is incompatible with .grad"):
            lib.autograd.grad(y, m.x) if how == "grad" else y.backward(inputs=[m.x])


def test_use_reentrant_not_passed_warns_and_defaults_to_reentrant():
    for lib in LIBS:
        m = Model(lib)
        ck = lib.utils.checkpoint
        with pytest.warns(UserWarning, match="use_reentrant parameter should be passed "
                                             "explicitly"):
            y = ck.checkpoint(m.block, m.x, m.ws[0], m.ws[1])
        assert type(y.grad_fn).__name__ == "CheckpointFunctionBackward"
        with pytest.warns(UserWarning, match="checkpoint_sequential: the use_reentrant"):
            ck.checkpoint_sequential([lambda t: t * 2, lambda t: t + 1], 2, m.x)


def test_reentrant_needs_an_input_that_requires_grad():
    for lib in LIBS:
        w = lib.tensor(_arr(1, (3, 3)), requires_grad=True)
        z = lib.tensor(_arr(2, (2, 3)))
        with pytest.warns(UserWarning, match="None of the inputs have requires_grad=True"):
            out = lib.utils.checkpoint.checkpoint(lambda t: t @ w, z, use_reentrant=True)
        assert not out.requires_grad
        with pytest.raises(RuntimeError, match="element 0 of tensors does not require grad"):
            out.sum().backward()
        # the non-reentrant form records the graph: w gets its gradient
        lib.utils.checkpoint.checkpoint(lambda t: t @ w, z, use_reentrant=False).sum().backward()
        assert w.grad is not None
        x = lib.tensor(_arr(3, (2, 3)), requires_grad=True)
        with pytest.raises(RuntimeError, match="none of output has requires_grad=True"):
            lib.utils.checkpoint.checkpoint(lambda t: t.detach() * 2, x,
                                            use_reentrant=True).sum().backward()


@pytest.mark.parametrize("kwargs, error, match", [
    ({"use_reentrant": True, "context_fn": lambda: None}, ValueError,
     "Passing `context_fn` or `debug` is only supported when use_reentrant=False"),
    ({"use_reentrant": True, "debug": True}, ValueError, "only supported when use_reentrant"),
    ({"use_reentrant": True, "extra": 1}, ValueError, "Unexpected keyword arguments: extra"),
    ({"use_reentrant": False, "determinism_check": "strict"}, ValueError,
     r"determinism_check should be one of \['default', 'none'\], but got strict"),
    ({"use_reentrant": False, "debug": True, "context_fn": lambda: None}, ValueError,
     "debug=True is incompatible with non-default context_fn"),
])
def test_argument_errors_match_pytorchs(kwargs, error, match):
    for lib in LIBS:
        x = lib.ones(2, requires_grad=True)
        with pytest.raises(error, match=match):
            lib.utils.checkpoint.checkpoint(lambda t, **kw: t.sin(), x, **kwargs)


def test_keyword_arguments_reach_the_function_and_its_rerun():
    seen = []

    def fn(x, *, scale):
        seen.append(scale)
        return (x * scale).exp()
    x = distgrad.ones(3, requires_grad=True)
    dck.checkpoint(fn, x, use_reentrant=False, scale=2.0).sum().backward()
    assert seen == [2.0, 2.0] and np.allclose(x.grad.numpy(), 2 * np.exp(2.0))


def _count_reruns(lib, early):
    marks = []

    def fn(x):
        b = x.exp()          # the only saved tensor
        marks.append("after exp")
        return (b + 1) * 3   # saves nothing
    x = lib.ones(3, requires_grad=True)
    with lib.utils.checkpoint.set_checkpoint_early_stop(early):
        y = lib.utils.checkpoint.checkpoint(fn, x, use_reentrant=False)
    y.sum().backward()
    return marks


def test_early_stop_ends_the_rerun_once_everything_is_recomputed():
    for lib in LIBS:
        assert _count_reruns(lib, True) == ["after exp"]           # the rerun stopped at exp
        assert _count_reruns(lib, False) == ["after exp"] * 2


def test_a_rerun_that_saves_differently_is_a_checkpoint_error():
    for lib in LIBS:
        ck = lib.utils.checkpoint
        calls = [0]

        def widens(x):  # saves a float64 tensor in the rerun
            calls[0] += 1
            return (x if calls[0] == 1 else x.double()).sin()
        x = lib.ones(4, 3, requires_grad=True)
        with pytest.raises(ck.CheckpointError, match="have different metadata than during the "
                                                     "forward pass"):
            ck.checkpoint(widens, x, use_reentrant=False).sum().backward()
        calls[0] = 0
        ck.checkpoint(widens, x, use_reentrant=False,                      # not checked
                      determinism_check="none").sum().backward()
        assert x.grad.dtype == lib.float32

        def fewer(x):
            calls[0] += 1
            return x.exp().exp() if calls[0] == 1 else x.exp() + 1
        calls[0] = 0
        with ck.set_checkpoint_early_stop(False), \
                pytest.raises(ck.CheckpointError, match="A different number of tensors was saved"):
            ck.checkpoint(fewer, x, use_reentrant=False).sum().backward()


def test_debug_lists_the_ops_of_both_runs():
    calls = [0]

    def fn(x):
        calls[0] += 1
        return (x if calls[0] == 1 else x[:2]).tanh()
    x = distgrad.ones(4, 3, requires_grad=True)
    y = dck.checkpoint(fn, x, use_reentrant=False, debug=True)
    with pytest.raises(dck.CheckpointError) as info:
        y.sum().backward()
    text = str(info.value)
    forward, recompute = text.split("== ops of the recomputation ==")
    assert "aten.tanh.default(float32[4, 3]) -> float32[4, 3]" in forward
    assert "aten.slice.Tensor(float32[4, 3]) -> float32[2, 3]" in recompute
    assert "test_checkpoint_function.py" in text  # where the op was called
    calls[0] = 0
    with dck.set_checkpoint_debug_enabled(True):     # the global switch, over debug=False
        y = dck.checkpoint(fn, x, use_reentrant=False)
    with pytest.raises(dck.CheckpointError, match="ops of the original forward"):
        y.sum().backward()


def test_a_recomputed_tensor_is_handed_out_once_per_backward():
    for lib in LIBS:
        class Twice(lib.autograd.Function):
            @staticmethod
            def forward(ctx, a):
                ctx.save_for_backward(a)
                return a * 2

            @staticmethod
            def backward(ctx, g):
                ctx.saved_tensors
                ctx.saved_tensors
                return g * 2
        x = lib.ones(3, requires_grad=True)
        y = lib.utils.checkpoint.checkpoint(lambda t: Twice.apply(t.sin()), x,
                                            use_reentrant=False)
        with pytest.raises(lib.utils.checkpoint.CheckpointError,
                           match="Unpack is being triggered for a tensor that was already "
                                 "unpacked once"):
            y.sum().backward()


def test_retain_graph_reruns_per_backward_and_a_group_reruns_once():
    for lib in LIBS:
        ck = lib.utils.checkpoint
        runs = [0]
        w = lib.ones(3, 3, requires_grad=True)

        def fn(x):
            runs[0] += 1
            return (x @ w).exp()
        x = lib.ones(2, 3, requires_grad=True)
        y = ck.checkpoint(fn, x, use_reentrant=False).sum()
        y.backward(retain_graph=True)
        y.backward()
        assert runs[0] == 3
        a = ck.checkpoint(fn, x, use_reentrant=False).sum()
        b = ck.checkpoint(fn, x, use_reentrant=False).sum()
        with ck.GraphExecGroup():
            a.backward()
            b.backward()
        assert runs[0] == 3 + 2 + 2
        with pytest.raises(RuntimeError, match="GraphExecGroup contexts cannot be nested"):
            with ck.GraphExecGroup(), ck.GraphExecGroup():
                pass


def test_an_input_modified_in_place_after_forward_fails_backward():
    x = distgrad.ones(3, requires_grad=True) * 1.0
    y = dck.checkpoint(lambda t: t.sin(), x, use_reentrant=False)
    x.mul_(2)
    with pytest.raises(RuntimeError, match="modified by an inplace operation.*an input of "
                                           "Checkpoint"):
        y.sum().backward()


def test_a_forward_context_that_swallows_the_error_is_refused():
    class Swallow:
        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return True
    x = distgrad.ones(3, requires_grad=True)
    with pytest.raises(RuntimeError, match="suppressed an exception raised during the "
                                           "checkpointed forward"):
        dck.checkpoint(lambda t: 1 / 0, x, use_reentrant=False,
                       context_fn=lambda: (Swallow(), contextlib.nullcontext()))


def test_without_grad_the_function_just_runs():
    x = distgrad.ones(3, requires_grad=True)
    with distgrad.no_grad():
        y = dck.checkpoint(lambda t: t.exp(), x, use_reentrant=False)
    assert y.grad_fn is None and np.allclose(y.numpy(), np.e)


@pytest.mark.parametrize("reentrant", [False, True])
def test_checkpoint_sequential_matches_pytorch_and_the_plain_model(reentrant):
    grads = []
    for lib in LIBS:
        lib.manual_seed(0)
        model = lib.nn.Sequential(*[m for _ in range(4)
                                    for m in (lib.nn.Linear(8, 8), lib.nn.Tanh())])
        if lib is torch:
            model.load_state_dict({k: torch.from_numpy(v.numpy().copy())
                                   for k, v in grads[0][1].items()})
        x = lib.tensor(_arr(0, (3, 8)), requires_grad=True)
        lib.utils.checkpoint.checkpoint_sequential(model, 3, x, use_reentrant=reentrant) \
            .pow(2).sum().backward()
        state = model.state_dict()
        grads.append(([x.grad.numpy()] + [p.grad.numpy() for p in model.parameters()], state))
        if lib is distgrad:
            for p in model.parameters():
                p.grad = None
            x2 = lib.tensor(_arr(0, (3, 8)), requires_grad=True)
            model(x2).pow(2).sum().backward()
            _bit_equal(grads[0][0], [x2.grad.numpy()] + [p.grad.numpy()
                                                       for p in model.parameters()])
    if torch is not None:
        _close(grads[0][0], grads[1][0])
    with pytest.raises(ValueError, match="Unexpected keyword arguments: other"):
        dck.checkpoint_sequential(model, 2, x, use_reentrant=False, other=1)


def test_device_helpers_on_a_cpu_only_library():
    x = distgrad.ones(2)
    assert dck.get_device_states(x) == ([], [])
    dck.set_device_states([], [])
    with pytest.raises(RuntimeError, match="CPU only"):
        dck.set_device_states([0], [None])
    assert dck.DefaultDeviceType.get_device_type() == "cpu"
    with pytest.raises(RuntimeError, match="Only tuple of tensors is supported"):
        dck.detach_variable([x])
    (d,) = dck.detach_variable((distgrad.ones(2, requires_grad=True),))
    assert d.requires_grad and d.grad_fn is None
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        dck.check_backward_validity([distgrad.ones(1, requires_grad=True)])


def test_the_module_is_reachable_as_pytorchs_is():
    import distgrad.utils
    assert distgrad.utils.checkpoint is dck
    torch = pytest.importorskip("torch")
    assert set(torch.utils.checkpoint.__all__) <= set(dck.__all__)
    assert distgrad.random.fork_rng is not None

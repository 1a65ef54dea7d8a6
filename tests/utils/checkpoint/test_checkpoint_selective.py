"""Selective activation checkpointing: a policy keeps some ops' outputs from the forward;
the recomputation reuses them (and does not compute them again) and reruns the rest.
Gradients are those without checkpointing, bit for bit, and PyTorch's with its SAC."""
import functools

import numpy as np
import pytest

import distgrad
from distgrad.ops import aten
from distgrad.testing.oracle import torch
from distgrad.utils import checkpoint as dck

pytestmark = pytest.mark.timeout(60)
LIBS = [distgrad] + ([torch] if torch is not None else [])


def _arr(seed, shape):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def _run(lib, context_fn=None):
    """mm, sigmoid, mm, tanh under a checkpoint (or none); the gradients and the ops the
    policy saw."""
    w1 = lib.tensor(_arr(1, (6, 6)), requires_grad=True)
    w2 = lib.tensor(_arr(2, (6, 6)), requires_grad=True)
    x = lib.tensor(_arr(0, (5, 6)), requires_grad=True)

    def fn(a):
        return ((a @ w1).sigmoid() @ w2).tanh()
    y = fn(x) if context_fn is None else lib.utils.checkpoint.checkpoint(
        fn, x, use_reentrant=False, context_fn=context_fn)
    y.pow(2).sum().backward()
    return [t.grad.numpy().copy() for t in (x, w1, w2)]


def _keep_mm(lib, seen):
    ck = lib.utils.checkpoint

    def policy(ctx, op, *args, **kwargs):
        seen.append((str(op), type(ctx.op_output).__name__, ctx.is_recompute))
        if op == lib.ops.aten.mm.default:
            return ck.CheckpointPolicy.MUST_SAVE
        return ck.CheckpointPolicy.PREFER_RECOMPUTE
    return functools.partial(ck.create_selective_checkpoint_contexts, policy)


def test_a_policy_sees_the_ops_pytorch_shows_and_gradients_match():
    plain = _run(distgrad)
    seen = {}
    results = {}
    for lib in LIBS:
        seen[lib] = []
        results[lib] = _run(lib, _keep_mm(lib, seen[lib]))
        assert [s[0] for s in seen[lib]] == ["aten.mm.default", "aten.sigmoid.default",
                                             "aten.mm.default", "aten.tanh.default"]
    assert all(not recompute for _, _, recompute in seen[distgrad])  # forward only
    for ours, want in zip(results[distgrad], plain):
        assert (ours == want).all()
    if torch is not None:
        for ours, theirs in zip(results[distgrad], results[torch]):
            np.testing.assert_allclose(ours, theirs, rtol=1e-5, atol=1e-6)


def test_kept_products_are_not_computed_again(monkeypatch):
    from distgrad.ops import linalg
    products = []
    real = np.matmul
    monkeypatch.setattr(linalg.np, "matmul", lambda *a: products.append(1) or real(*a))
    _run(distgrad)
    plain = len(products)                          # forward 2, backward 4
    products.clear()
    _run(distgrad, functools.partial(dck.create_selective_checkpoint_contexts,
                                     [aten.mm.default]))
    assert len(products) == plain                  # the rerun reused both products
    products.clear()
    _run(distgrad, dck.noop_context_fn)
    assert len(products) == plain + 2              # plain checkpointing recomputes them


def test_the_list_form_and_bool_policies():
    plain = _run(distgrad)
    for context_fn in (
            functools.partial(dck.create_selective_checkpoint_contexts,
                              [aten.mm.default, aten.tanh.default]),
            functools.partial(dck.create_selective_checkpoint_contexts,
                              lambda ctx, op, *args: op == aten.sigmoid.default)):
        for got, want in zip(_run(distgrad, context_fn), plain):
            assert (got == want).all()


def test_errors_match_pytorchs():
    for lib in LIBS:
        ck = lib.utils.checkpoint
        with pytest.raises(ValueError, match="Expected op in `op_list` to be an OpOverload but "
                                             "got: aten.mm of type"):
            ck.create_selective_checkpoint_contexts([lib.ops.aten.mm])
        with pytest.raises(TypeError, match="policy_fn_or_list must be either a function or a "
                                            "list of ops"):
            ck.create_selective_checkpoint_contexts(3)
        keep = functools.partial(ck.create_selective_checkpoint_contexts,
                                 [lib.ops.aten.mm.default])
        w = lib.tensor(_arr(1, (4, 4)), requires_grad=True)
        x = lib.tensor(_arr(2, (3, 4)), requires_grad=True)
        y = ck.checkpoint(lambda a: (a @ w).sigmoid(), x, use_reentrant=False,
                          context_fn=keep).sum()
        y.backward(retain_graph=True)
        with pytest.raises(RuntimeError, match="Trying to backward an extra time"):
            y.backward()
        kept = []

        def keeps(a):
            m = a @ w
            kept.append(m)
            return m.sigmoid()
        y = ck.checkpoint(keeps, x, use_reentrant=False, context_fn=keep).sum()
        with lib.no_grad():
            kept[0].add_(1)
        with pytest.raises(RuntimeError, match="Tensor cached during selective activation "
                                               "checkpoint has been mutated"):
            y.backward()


def test_an_op_distgrad_does_not_record_warns_and_unknown_names_fail():
    with pytest.warns(UserWarning, match="distgrad records no op aten.addmm.default"):
        dck.create_selective_checkpoint_contexts([aten.addmm.default])
    with pytest.raises(AttributeError, match="has no attribute 'mmm'"):
        aten.mmm
    with pytest.raises(AttributeError, match="has no overload name 'Scalarr'"):
        aten.add.Scalarr
    assert aten.linear.default.name() == "aten::linear"
    assert aten.add.Tensor is aten.add.Tensor and aten.add.Tensor.name() == "aten::add.Tensor"


def test_linear_layers_keep_their_outputs_and_skip_them_in_the_rerun(monkeypatch):
    from distgrad.ops import linalg
    distgrad.manual_seed(0)
    model = distgrad.nn.Sequential(distgrad.nn.Linear(8, 8), distgrad.nn.GELU(),
                                   distgrad.nn.Linear(8, 8))
    x = distgrad.tensor(_arr(0, (4, 8)), requires_grad=True)
    model(x).sum().backward()
    plain = [p.grad.numpy().copy() for p in model.parameters()]
    model.zero_grad()
    computed = []
    real = linalg._times_weight_transposed
    monkeypatch.setattr(linalg, "_times_weight_transposed",
                        lambda *a: computed.append(1) or real(*a))
    keep = functools.partial(dck.create_selective_checkpoint_contexts, [aten.linear.default])
    dck.checkpoint(model, x, use_reentrant=False, context_fn=keep).sum().backward()
    assert len(computed) == 2          # the forward's two; none in the rerun
    for p, want in zip(model.parameters(), plain):
        assert (p.grad.numpy() == want).all()

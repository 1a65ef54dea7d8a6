"""Transformer layers against PyTorch: submodule names, state_dict keys, parameter
counts, outputs and gradients (dropout 0 for determinism), masks, and dropout in
training mode."""
import copy

import numpy as np
import pytest

import distgrad
from distgrad import nn
from distgrad.nn import functional as F
from distgrad.testing.oracle import torch

pytestmark = pytest.mark.timeout(60)
needs_torch = pytest.mark.skipif(torch is None, reason="torch not installed")

D, HEADS, FF, N, S, T = 8, 2, 16, 2, 5, 4


def copy_from_torch(ours, theirs):
    sd = theirs.state_dict()
    assert list(ours.state_dict().keys()) == list(sd.keys())
    ours.load_state_dict({k: distgrad.tensor(v.detach().numpy().copy()) for k, v in sd.items()})


def assert_close(ours, theirs, what, atol=2e-5, rtol=1e-4):
    assert ours is not None, f"{what}: distgrad has no value, torch has one"
    np.testing.assert_allclose(ours.detach().numpy(), theirs.detach().numpy(), atol=atol,
                               rtol=rtol, err_msg=what)


def compare(ours, theirs, inputs, kwargs_of, extra_check=None):
    """Run both with the same float inputs (requires_grad) and masks; compare outputs and
    the gradients of inputs and parameters."""
    copy_from_torch(ours, theirs)
    ours_in = [distgrad.tensor(a, requires_grad=True) for a in inputs]
    theirs_in = [torch.tensor(a, requires_grad=True) for a in inputs]
    out = ours(*ours_in, **kwargs_of(distgrad))
    tout = theirs(*theirs_in, **kwargs_of(torch))
    assert_close(out, tout, "output")
    g = np.random.default_rng(99).standard_normal(tuple(tout.shape)).astype(np.float32)
    out.backward(distgrad.tensor(g))
    tout.backward(torch.tensor(g))
    for i, (a, b) in enumerate(zip(ours_in, theirs_in)):
        assert_close(a.grad, b.grad, f"grad of input {i}")
    named = dict(theirs.named_parameters())
    for name, p in ours.named_parameters():
        assert_close(p.grad, named[name].grad, f"grad of {name}")


def seq(rng, length, batch_first, batched=True):
    shape = ((N, length, D) if batch_first else (length, N, D)) if batched else (length, D)
    return rng.standard_normal(shape).astype(np.float32)


def no_masks(lib):
    return {}


ENCODER_LAYERS = {
    "post_norm_relu": {},
    "pre_norm_gelu_str": {"norm_first": True, "activation": "gelu"},
    "batch_first_no_bias": {"batch_first": True, "bias": False},
    "eps": {"layer_norm_eps": 1e-3, "batch_first": True},
}


@needs_torch
@pytest.mark.parametrize("name", list(ENCODER_LAYERS), ids=list(ENCODER_LAYERS))
def test_encoder_layer_matches_torch(name):
    kw = dict(ENCODER_LAYERS[name], dropout=0.0)
    ours = nn.TransformerEncoderLayer(D, HEADS, FF, **kw)
    theirs = torch.nn.TransformerEncoderLayer(D, HEADS, FF, **kw)
    x = seq(np.random.default_rng(0), S, kw.get("batch_first", False))
    compare(ours, theirs, [x], no_masks)


@needs_torch
def test_encoder_layer_callable_activation():
    ours = nn.TransformerEncoderLayer(D, HEADS, FF, dropout=0.0, activation=F.silu)
    theirs = torch.nn.TransformerEncoderLayer(D, HEADS, FF, dropout=0.0,
                                              activation=torch.nn.functional.silu)
    assert ours.activation_relu_or_gelu == theirs.activation_relu_or_gelu == 0
    assert nn.TransformerEncoderLayer(D, HEADS, activation=nn.GELU()).activation_relu_or_gelu == 2
    compare(ours, theirs, [seq(np.random.default_rng(1), S, False)], no_masks)


def _encoder_masks(kind, rng):
    kpm = np.zeros((N, S), dtype=bool)
    kpm[1, -2:] = True
    causal = np.triu(np.ones((S, S), dtype=bool), 1)
    return {
        "src_mask_bool": {"src_mask": causal},
        "src_mask_float": {"src_mask": rng.standard_normal((S, S)).astype(np.float32)},
        "src_mask_3d": {"src_mask": (rng.random((N * HEADS, S, S)) < 0.3) & ~np.eye(S, dtype=bool)},
        "kpm": {"src_key_padding_mask": kpm},
        "both": {"src_mask": causal, "src_key_padding_mask": kpm},
        "causal_hint": {"src_mask": np.where(causal, -np.inf, 0).astype(np.float32),
                        "is_causal": True},
    }[kind]


@needs_torch
@pytest.mark.parametrize("kind", ["src_mask_bool", "src_mask_float", "src_mask_3d", "kpm", "both",
                                  "causal_hint"])
def test_encoder_layer_masks(kind):
    rng = np.random.default_rng(2)
    masks = _encoder_masks(kind, rng)
    ours = nn.TransformerEncoderLayer(D, HEADS, FF, dropout=0.0)
    theirs = torch.nn.TransformerEncoderLayer(D, HEADS, FF, dropout=0.0)
    compare(ours, theirs, [seq(rng, S, False)],
            lambda lib: {k: lib.tensor(v) if isinstance(v, np.ndarray) else v
                         for k, v in masks.items()})


@needs_torch
@pytest.mark.parametrize("mask", ["none", "causal_detected", "kpm"])
@pytest.mark.parametrize("with_norm", [False, True])
def test_encoder_stack(mask, with_norm):
    rng = np.random.default_rng(3)
    layer_kw = {"dropout": 0.0, "batch_first": True}
    ours = nn.TransformerEncoder(nn.TransformerEncoderLayer(D, HEADS, FF, **layer_kw), 2,
                                 norm=nn.LayerNorm(D) if with_norm else None)
    theirs = torch.nn.TransformerEncoder(torch.nn.TransformerEncoderLayer(D, HEADS, FF, **layer_kw),
                                         2, norm=torch.nn.LayerNorm(D) if with_norm else None,
                                         enable_nested_tensor=False)
    assert [n for n, _ in ours.named_modules()] == [n for n, _ in theirs.named_modules()]
    kpm = np.zeros((N, S), dtype=bool)
    kpm[0, -1] = True

    def kwargs(lib):
        if mask == "causal_detected":
            return {"mask": nn.Transformer.generate_square_subsequent_mask(S) if lib is distgrad
                    else torch.nn.Transformer.generate_square_subsequent_mask(S)}
        return {"src_key_padding_mask": lib.tensor(kpm)} if mask == "kpm" else {}
    compare(ours, theirs, [seq(rng, S, True)], kwargs)


@needs_torch
@pytest.mark.parametrize("norm_first", [False, True])
@pytest.mark.parametrize("masks", ["none", "all"])
def test_decoder_layer_matches_torch(norm_first, masks):
    rng = np.random.default_rng(4)
    kw = {"dropout": 0.0, "norm_first": norm_first}
    ours = nn.TransformerDecoderLayer(D, HEADS, FF, **kw)
    theirs = torch.nn.TransformerDecoderLayer(D, HEADS, FF, **kw)
    tgt_kpm = np.zeros((N, T), dtype=bool)
    tgt_kpm[1, -1] = True
    mem_kpm = np.zeros((N, S), dtype=bool)
    mem_kpm[0, -2:] = True
    mem_mask = rng.standard_normal((T, S)).astype(np.float32)

    def kwargs(lib):
        if masks == "none":
            return {}
        return {"tgt_mask": lib.tensor(np.triu(np.ones((T, T), dtype=bool), 1)),
                "memory_mask": lib.tensor(mem_mask), "tgt_key_padding_mask": lib.tensor(tgt_kpm),
                "memory_key_padding_mask": lib.tensor(mem_kpm)}
    compare(ours, theirs, [seq(rng, T, False), seq(rng, S, False)], kwargs)


@needs_torch
def test_decoder_stack_with_causal_hint():
    rng = np.random.default_rng(5)
    layer_kw = {"dropout": 0.0, "batch_first": True}
    ours = nn.TransformerDecoder(nn.TransformerDecoderLayer(D, HEADS, FF, **layer_kw), 2,
                                 nn.LayerNorm(D))
    theirs = torch.nn.TransformerDecoder(torch.nn.TransformerDecoderLayer(D, HEADS, FF, **layer_kw),
                                         2, torch.nn.LayerNorm(D))
    causal = np.triu(np.full((T, T), -np.inf, dtype=np.float32), 1)
    compare(ours, theirs, [seq(rng, T, True), seq(rng, S, True)],
            lambda lib: {"tgt_mask": lib.tensor(causal), "tgt_is_causal": True})


@needs_torch
@pytest.mark.parametrize("batch_first", [False, True])
def test_full_transformer_matches_torch(batch_first):
    rng = np.random.default_rng(6)
    kw = {"d_model": D, "nhead": HEADS, "num_encoder_layers": 2, "num_decoder_layers": 1,
          "dim_feedforward": FF, "dropout": 0.0, "batch_first": batch_first}
    ours, theirs = nn.Transformer(**kw), torch.nn.Transformer(**kw)
    assert sum(p.numel() for p in ours.parameters()) == sum(p.numel() for p in theirs.parameters())
    assert [(n, tuple(p.shape)) for n, p in ours.named_parameters()] == \
        [(n, tuple(p.shape)) for n, p in theirs.named_parameters()]

    def kwargs(lib):
        return {"tgt_mask": lib.nn.Transformer.generate_square_subsequent_mask(T),
                "src_key_padding_mask": lib.tensor(np.array([[False] * S,
                                                             [False] * 3 + [True] * 2]))}
    compare(ours, theirs, [seq(rng, S, batch_first), seq(rng, T, batch_first)], kwargs)


@needs_torch
def test_unbatched_encoder_layer():
    ours = nn.TransformerEncoderLayer(D, HEADS, FF, dropout=0.0)
    theirs = torch.nn.TransformerEncoderLayer(D, HEADS, FF, dropout=0.0)
    compare(ours, theirs, [seq(np.random.default_rng(7), S, False, batched=False)], no_masks)


@needs_torch
def test_state_dict_and_submodules_match_torch():
    for make in (lambda m: m.TransformerEncoderLayer(D, HEADS, FF),
                 lambda m: m.TransformerDecoderLayer(D, HEADS, FF, bias=False),
                 lambda m: m.Transformer(D, HEADS, 1, 1, FF)):
        ours, theirs = make(nn), make(torch.nn)
        assert list(ours.state_dict()) == list(theirs.state_dict())
        assert [n for n, _ in ours.named_children()] == [n for n, _ in theirs.named_children()]


def test_generate_square_subsequent_mask():
    m = nn.Transformer.generate_square_subsequent_mask(3)
    assert m.dtype == distgrad.float32
    expected = np.array([[0, -np.inf, -np.inf], [0, 0, -np.inf], [0, 0, 0]], dtype=np.float32)
    np.testing.assert_array_equal(m.numpy(), expected)
    assert nn.Transformer.generate_square_subsequent_mask(2, dtype=distgrad.float64).dtype == \
        distgrad.float64


def test_transformer_initialisation_is_xavier():
    distgrad.manual_seed(0)
    model = nn.Transformer(16, 2, 1, 1, 32, dropout=0.0)
    w = model.encoder.layers[0].linear1.weight.detach().numpy()
    bound = np.sqrt(6.0 / (16 + 32))
    assert np.abs(w).max() <= bound and np.abs(w).max() > 0.9 * bound


def test_layers_are_independent_copies():
    layer = nn.TransformerEncoderLayer(D, HEADS, FF)
    enc = nn.TransformerEncoder(layer, 3)
    assert enc.layers[0].linear1.weight is not enc.layers[1].linear1.weight
    np.testing.assert_array_equal(enc.layers[0].linear1.weight.detach().numpy(),
                                  enc.layers[2].linear1.weight.detach().numpy())
    assert len(enc.state_dict()) == 3 * len(layer.state_dict())


def test_errors():
    with pytest.raises(RuntimeError, match="activation should be relu/gelu, not tanh"):
        nn.TransformerEncoderLayer(D, HEADS, activation="tanh")
    with pytest.raises(AssertionError, match="divisible by num_heads"):
        nn.TransformerEncoderLayer(10, 3)
    model = nn.Transformer(D, HEADS, 1, 1, FF)
    with pytest.raises(RuntimeError, match="the batch number of src and tgt must be equal"):
        model(distgrad.randn(S, 2, D), distgrad.randn(T, 3, D))
    with pytest.raises(RuntimeError, match="the feature number of src and tgt must be equal"):
        model(distgrad.randn(S, 2, D), distgrad.randn(T, 2, D + 1))
    layer = nn.TransformerEncoderLayer(D, HEADS, FF)
    with pytest.raises(RuntimeError, match="shape of the 2D attn_mask"):
        layer(distgrad.randn(S, 2, D), src_mask=distgrad.zeros(S, S + 1))


def test_dropout_in_training_mode():
    """Train mode is random: the feed-forward dropout zeros about p of its inputs and
    scales the rest by 1 / (1 - p); eval is deterministic."""
    distgrad.manual_seed(0)
    layer = nn.TransformerEncoderLayer(D, HEADS, 64, dropout=0.5)
    x = distgrad.randn(S, N, D)
    assert not np.allclose(layer(x).detach().numpy(), layer(x).detach().numpy())
    seen = []
    hook = layer.dropout.register_forward_hook(
        lambda m, i, o: seen.append((i[0].detach().numpy(), o.detach().numpy())))
    layer(x)
    hook.remove()
    before, after = seen[0]
    live = before != 0
    assert abs((after[live] == 0).mean() - 0.5) < 0.08
    kept = live & (after != 0)
    np.testing.assert_allclose(after[kept], 2 * before[kept], rtol=1e-6)
    layer.eval()
    np.testing.assert_array_equal(layer(x).detach().numpy(), layer(x).detach().numpy())


def test_deepcopy_keeps_configuration():
    layer = nn.TransformerEncoderLayer(D, HEADS, FF, norm_first=True, batch_first=True)
    clone = copy.deepcopy(layer)
    assert clone.norm_first and clone.self_attn.batch_first

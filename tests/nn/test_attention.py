"""MultiheadAttention and scaled_dot_product_attention against PyTorch.

Same parameters (copied from torch's freshly initialised module through
``state_dict``), same inputs and masks: outputs, attention weights and the
gradients of inputs and parameters must agree. The fused attention node is
gradchecked (first and second order) in float64 without torch.
"""
import numpy as np
import pytest

import distgrad
from distgrad import nn
from distgrad.autograd import gradcheck, gradgradcheck
from distgrad.nn import functional as F
from distgrad.ops.attention import attention
from distgrad.testing.oracle import torch

pytestmark = pytest.mark.timeout(60)
needs_torch = pytest.mark.skipif(torch is None, reason="torch not installed")

E, H, L, S, N = 8, 2, 4, 5, 3


def copy_from_torch(ours, theirs):
    """Load torch's parameters into ours; the state_dict keys must be the same."""
    sd = theirs.state_dict()
    assert list(ours.state_dict().keys()) == list(sd.keys())
    ours.load_state_dict({k: distgrad.tensor(v.detach().numpy().copy()) for k, v in sd.items()})


def pair(array, requires_grad=True):
    return (distgrad.tensor(array, requires_grad=requires_grad),
            torch.tensor(array, requires_grad=requires_grad))


def assert_close(ours, theirs, what, atol=1e-5, rtol=1e-4):
    if theirs is None:
        assert ours is None or not np.any(ours.numpy()), f"{what}: torch has none"
        return
    assert ours is not None, f"{what}: distgrad has none, torch has one"
    np.testing.assert_allclose(ours.detach().numpy(), theirs.detach().numpy(), atol=atol,
                               rtol=rtol, equal_nan=True, err_msg=what)


def masks(kind, rng, batched=True):
    """(attn_mask, key_padding_mask) arrays of the requested kind, with one key of each
    batch entry padded and one forbidden position per query row."""
    attn = rng.random((L, S)) < 0.25
    attn[:, 0] = False  # every query keeps at least one key
    kpm = np.zeros((N, S), dtype=bool)
    kpm[np.arange(N), rng.integers(1, S, N)] = True
    if not batched:
        kpm = kpm[0]
    as_float = lambda m: np.where(m, -np.inf, 0).astype(np.float32)  # noqa: E731
    return {
        "none": (None, None),
        "attn_bool": (attn, None),
        "attn_float": (as_float(attn) + rng.standard_normal((L, S)).astype(np.float32), None),
        "attn_3d_bool": (np.repeat(attn[None], N * H, 0) | (rng.random((N * H, L, S)) < 0.2)
                         & ~np.eye(L, S, dtype=bool)[None], None),
        "attn_3d_float": (rng.standard_normal((N * H, L, S)).astype(np.float32), None),
        "kpm_bool": (None, kpm),
        "kpm_float": (None, as_float(kpm)),
        "both_bool": (attn, kpm),
        "both_float": (as_float(attn), as_float(kpm)),
    }[kind]


def run_mha(config, call=(), mask_kind="none", inputs="self", batched=True, seed=0):
    rng = np.random.default_rng(seed)
    config = dict(config)
    theirs = torch.nn.MultiheadAttention(E, H, **config)
    ours = nn.MultiheadAttention(E, H, **config)
    copy_from_torch(ours, theirs)
    batch_first = config.get("batch_first", False)
    kdim, vdim = config.get("kdim") or E, config.get("vdim") or E

    def seq(length, width):
        if not batched:
            return rng.standard_normal((length, width)).astype(np.float32)
        shape = (N, length, width) if batch_first else (length, N, width)
        return rng.standard_normal(shape).astype(np.float32)

    q = pair(seq(L, E))
    if inputs == "self":
        q = pair(seq(L, E))
        k = v = q
        q_len_is_s = True
    elif inputs == "kv":
        k = pair(seq(S, kdim))
        v = k
        q_len_is_s = False
    else:
        k, v = pair(seq(S, kdim)), pair(seq(S, vdim))
        q_len_is_s = False
    attn, kpm = masks(mask_kind, rng, batched)
    if q_len_is_s and attn is not None:  # self-attention: square masks
        attn = attn[..., :L, :L] if attn.shape[-1] > L else attn
    if q_len_is_s and kpm is not None:
        kpm = kpm[..., :L]
    call = dict(call)
    results = []
    for lib, side, module in ((distgrad, 0, ours), (torch, 1, theirs)):
        kw = dict(call)
        if attn is not None:
            kw["attn_mask"] = lib.tensor(attn)
        if kpm is not None:
            kw["key_padding_mask"] = lib.tensor(kpm)
        results.append(module(q[side], k[side], v[side], **kw))
    (out, w), (tout, tw) = results
    assert_close(out, tout, "attn_output")
    assert_close(w, tw, "attn_weights")
    g = rng.standard_normal(tuple(tout.shape)).astype(np.float32)
    loss, tloss = (out * distgrad.tensor(g)).sum(), (tout * torch.tensor(g)).sum()
    if w is not None and not np.isnan(tw.detach().numpy()).any():
        gw = rng.standard_normal(tuple(tw.shape)).astype(np.float32)
        loss = loss + (w * distgrad.tensor(gw)).sum()
        tloss = tloss + (tw * torch.tensor(gw)).sum()
    loss.backward()
    tloss.backward()
    for name, (a, b) in {"query": q, "key": k, "value": v}.items():
        assert_close(a.grad, b.grad, f"grad of {name}")
    for (name, p), (_, tp) in zip(ours.named_parameters(), theirs.named_parameters()):
        assert_close(p.grad, tp.grad, f"grad of {name}")
    return out, w


CONFIGS = {
    "default": {},
    "batch_first": {"batch_first": True},
    "no_bias": {"bias": False},
    "bias_kv": {"add_bias_kv": True},
    "zero_attn": {"add_zero_attn": True},
    "bias_kv_zero_attn_bf": {"add_bias_kv": True, "add_zero_attn": True, "batch_first": True},
}


@needs_torch
@pytest.mark.parametrize("config", list(CONFIGS), ids=list(CONFIGS))
@pytest.mark.parametrize("inputs", ["self", "kv", "qkv"])
def test_configurations(config, inputs):
    run_mha(CONFIGS[config], inputs=inputs)


@needs_torch
@pytest.mark.parametrize("mask_kind", ["attn_bool", "attn_float", "attn_3d_bool", "attn_3d_float",
                                       "kpm_bool", "kpm_float", "both_bool", "both_float"])
@pytest.mark.parametrize("need_weights", [True, False])
def test_masks(mask_kind, need_weights):
    run_mha({"batch_first": True}, {"need_weights": need_weights}, mask_kind, inputs="qkv")


@needs_torch
@pytest.mark.parametrize("mask_kind", ["both_bool", "attn_3d_float"])
def test_masks_with_bias_kv_and_zero_attn(mask_kind):
    run_mha({"add_bias_kv": True, "add_zero_attn": True}, (), mask_kind, inputs="kv")


@needs_torch
@pytest.mark.parametrize("kdim,vdim", [(6, 6), (6, 10), (None, 10)])
@pytest.mark.parametrize("batch_first", [False, True])
def test_separate_projection_weights(kdim, vdim, batch_first):
    ours = nn.MultiheadAttention(E, H, kdim=kdim, vdim=vdim)
    assert ours.in_proj_weight is None and ours.q_proj_weight.shape == (E, E)
    assert ours.k_proj_weight.shape == (E, kdim or E) and ours.v_proj_weight.shape == (E, vdim)
    run_mha({"kdim": kdim, "vdim": vdim, "batch_first": batch_first}, inputs="qkv",
            mask_kind="both_bool")


@needs_torch
@pytest.mark.parametrize("call", [{"average_attn_weights": False}, {"need_weights": False}],
                         ids=["per_head_weights", "no_weights"])
def test_weights_options(call):
    out, w = run_mha({}, call, "kpm_bool", inputs="kv")
    if call.get("need_weights") is False:
        assert w is None
    else:
        assert w.shape == (N, H, L, S)


@needs_torch
@pytest.mark.parametrize("mask_kind", ["none", "attn_bool", "kpm_bool"])
@pytest.mark.parametrize("batch_first", [False, True])
def test_unbatched(mask_kind, batch_first):
    run_mha({"batch_first": batch_first}, (), mask_kind, inputs="qkv", batched=False)


@needs_torch
def test_unbatched_3d_mask():
    """Unbatched, a 3-D attn_mask is (num_heads, L, S)."""
    rng = np.random.default_rng(3)
    theirs = torch.nn.MultiheadAttention(E, H)
    ours = nn.MultiheadAttention(E, H)
    copy_from_torch(ours, theirs)
    x = rng.standard_normal((L, E)).astype(np.float32)
    m = rng.standard_normal((H, L, L)).astype(np.float32)
    out, w = ours(*(distgrad.tensor(x),) * 3, attn_mask=distgrad.tensor(m))
    tout, tw = theirs(*(torch.tensor(x),) * 3, attn_mask=torch.tensor(m))
    assert_close(out, tout, "output")
    assert_close(w, tw, "weights")


@needs_torch
@pytest.mark.parametrize("need_weights", [True, False])
def test_is_causal_hint_with_causal_mask(need_weights):
    mask = nn.Transformer.generate_square_subsequent_mask(L).numpy()
    rng = np.random.default_rng(4)
    theirs = torch.nn.MultiheadAttention(E, H, batch_first=True)
    ours = nn.MultiheadAttention(E, H, batch_first=True)
    copy_from_torch(ours, theirs)
    x = pair(rng.standard_normal((N, L, E)).astype(np.float32))
    out, _ = ours(x[0], x[0], x[0], attn_mask=distgrad.tensor(mask), is_causal=True,
                  need_weights=need_weights)
    tout, _ = theirs(x[1], x[1], x[1], attn_mask=torch.tensor(mask), is_causal=True,
                     need_weights=need_weights)
    assert_close(out, tout, "output")
    out.sum().backward()
    tout.sum().backward()
    assert_close(x[0].grad, x[1].grad, "grad of input")


@needs_torch
def test_fully_masked_rows_match_torch():
    """A query whose keys are all padded: NaN with weights (softmax), zeros without (SDPA)."""
    kpm = np.zeros((N, S), dtype=bool)
    kpm[0] = True
    rng = np.random.default_rng(5)
    theirs = torch.nn.MultiheadAttention(E, H)
    ours = nn.MultiheadAttention(E, H)
    copy_from_torch(ours, theirs)
    q = rng.standard_normal((L, N, E)).astype(np.float32)
    kv = rng.standard_normal((S, N, E)).astype(np.float32)
    for need_weights in (True, False):
        out, _ = ours(distgrad.tensor(q), distgrad.tensor(kv), distgrad.tensor(kv),
                      key_padding_mask=distgrad.tensor(kpm), need_weights=need_weights)
        tout, _ = theirs(torch.tensor(q), torch.tensor(kv), torch.tensor(kv),
                         key_padding_mask=torch.tensor(kpm), need_weights=need_weights)
        assert_close(out, tout, f"need_weights={need_weights}")
    assert np.isnan(ours(distgrad.tensor(q), distgrad.tensor(kv), distgrad.tensor(kv),
                         key_padding_mask=distgrad.tensor(kpm))[0].detach().numpy()[:, 0]).all()


@needs_torch
@pytest.mark.parametrize("config", [{}, {"kdim": 6, "vdim": 4}, {"add_bias_kv": True},
                                    {"bias": False}], ids=["packed", "separate", "bias_kv",
                                                           "no_bias"])
def test_parameters_and_state_dict_match_torch(config):
    theirs = torch.nn.MultiheadAttention(E, H, **config)
    ours = nn.MultiheadAttention(E, H, **config)
    assert list(ours.state_dict()) == list(theirs.state_dict())
    assert [(n, tuple(p.shape)) for n, p in ours.named_parameters()] == \
        [(n, tuple(p.shape)) for n, p in theirs.named_parameters()]
    assert type(ours.out_proj).__name__ == type(theirs.out_proj).__name__
    assert repr(ours) == repr(theirs)


def test_default_initialisation():
    distgrad.manual_seed(0)
    mha = nn.MultiheadAttention(64, 4, add_bias_kv=True)
    bound = np.sqrt(6.0 / (64 + 3 * 64))  # xavier_uniform_ over (3E, E)
    w = mha.in_proj_weight.detach().numpy()
    assert np.abs(w).max() <= bound and np.abs(w).max() > 0.9 * bound
    assert not np.any(mha.in_proj_bias.detach().numpy())
    assert not np.any(mha.out_proj.bias.detach().numpy())
    assert np.abs(mha.out_proj.weight.detach().numpy()).max() <= 1 / 8  # Linear's kaiming bound
    assert 0.0 < mha.bias_k.detach().numpy().std() < 1.0


def test_argument_errors():
    with pytest.raises(AssertionError, match="divisible by num_heads"):
        nn.MultiheadAttention(10, 3)
    with pytest.raises(ValueError, match="greater than 0"):
        nn.MultiheadAttention(0, 2)
    mha = nn.MultiheadAttention(E, H)
    x = distgrad.randn(L, N, E)
    with pytest.raises(RuntimeError, match="shape of the 2D attn_mask"):
        mha(x, x, x, attn_mask=distgrad.zeros(L, L + 1))
    with pytest.raises(RuntimeError, match="shape of the 3D attn_mask"):
        mha(x, x, x, attn_mask=distgrad.zeros(N, L, L))
    with pytest.raises(AssertionError, match="key_padding_mask"):
        mha(x, x, x, key_padding_mask=distgrad.zeros(N, L, 1, dtype=distgrad.bool))
    with pytest.raises(AssertionError, match="key_padded_mask.shape\\[1\\]"):
        mha(x, x, x, key_padding_mask=distgrad.zeros(N, L + 2, dtype=distgrad.bool))
    with pytest.raises(AssertionError, match="only bool and floating"):
        mha(x, x, x, attn_mask=distgrad.zeros(L, L, dtype=distgrad.int64))
    with pytest.raises(AssertionError, match="embedding dimension of 8"):
        y = distgrad.randn(L, N, E + 1)
        mha(y, y, y)
    with pytest.raises(AssertionError, match="query should be unbatched 2D or batched 3D"):
        y = distgrad.randn(1, L, N, E)
        mha(y, y, y)
    with pytest.raises(AssertionError, match="expected `key` and `value` to be 3-D"):
        mha(x, x[0], x[0])
    with pytest.raises(AssertionError, match="expected `attn_mask` to be `None`, 2-D or 3-D"):
        mha(x[:, 0], x[:, 0], x[:, 0], attn_mask=distgrad.zeros(L))
    with pytest.raises(RuntimeError, match="Need attn_mask if specifying the is_causal hint"):
        mha(x, x, x, is_causal=True)
    with pytest.warns(UserWarning, match="mismatched key_padding_mask and attn_mask"):
        mha(x, x, x, key_padding_mask=distgrad.zeros(N, L, dtype=distgrad.bool),
            attn_mask=distgrad.zeros(L, L))


def test_dropout_on_attention_weights():
    """Training mode drops weights with probability p and rescales the rest; eval does not."""
    distgrad.manual_seed(0)
    mha = nn.MultiheadAttention(E, H, dropout=0.4)
    x = distgrad.randn(16, 8, E)
    _, w = mha(x, x, x, average_attn_weights=False)
    w = w.detach().numpy()
    assert abs((w == 0).mean() - 0.4) < 0.04
    mha.eval()
    _, w_eval = mha(x, x, x, average_attn_weights=False)
    np.testing.assert_allclose(w_eval.detach().numpy().sum(-1), 1.0, rtol=1e-5)
    # E[dropped weights] = weights: the rescaling keeps row sums near 1 on average
    assert abs(w.sum(-1).mean() - 1.0) < 0.05


@needs_torch
def test_functional_multi_head_attention_forward_matches_torch():
    rng = np.random.default_rng(6)
    theirs = torch.nn.MultiheadAttention(E, H)
    q, kv = (rng.standard_normal(s).astype(np.float32) for s in [(L, N, E), (S, N, E)])
    sd = {k: v.detach().numpy() for k, v in theirs.state_dict().items()}
    static_k = rng.standard_normal((N * H, S, E // H)).astype(np.float32)
    for lib in (distgrad, torch):
        args = (lib.tensor(q), lib.tensor(kv), lib.tensor(kv), E, H,
                lib.tensor(sd["in_proj_weight"]), lib.tensor(sd["in_proj_bias"]), None, None,
                False, 0.0, lib.tensor(sd["out_proj.weight"]), lib.tensor(sd["out_proj.bias"]))
        F_ = F if lib is distgrad else torch.nn.functional
        out = F_.multi_head_attention_forward(*args, static_k=lib.tensor(static_k))
        if lib is distgrad:
            ours = out
    assert_close(ours[0], out[0], "output with static_k")
    assert_close(ours[1], out[1], "weights with static_k")


# scaled_dot_product_attention

def _sdpa_pair(shapes, mask=None, seed=7, **kw):
    rng = np.random.default_rng(seed)
    arrays = [rng.standard_normal(s) for s in shapes]
    ours = [distgrad.tensor(a, requires_grad=True) for a in arrays]
    theirs = [torch.tensor(a, requires_grad=True) for a in arrays]
    o = F.scaled_dot_product_attention(
        *ours, attn_mask=None if mask is None else distgrad.tensor(mask), **kw)
    t = torch.nn.functional.scaled_dot_product_attention(
        *theirs, attn_mask=None if mask is None else torch.tensor(mask), **kw)
    assert_close(o, t, "output", atol=1e-10, rtol=1e-8)
    g = rng.standard_normal(tuple(t.shape))
    o.backward(distgrad.tensor(g))
    t.backward(torch.tensor(g))
    for i, (a, b) in enumerate(zip(ours, theirs)):
        assert_close(a.grad, b.grad, f"grad of input {i}", atol=1e-10, rtol=1e-8)


SDPA_CASES = {
    "plain": ([(2, 3, 4, 8), (2, 3, 5, 8), (2, 3, 5, 6)], {}),
    "causal": ([(2, 3, 4, 8), (2, 3, 5, 8), (2, 3, 5, 6)], {"is_causal": True}),
    "scale_broadcast_batch": ([(2, 3, 4, 8), (3, 5, 8), (3, 5, 6)], {"scale": 0.7}),
    "unbatched": ([(4, 8), (5, 8), (5, 6)], {}),
    "gqa": ([(2, 4, 4, 8), (2, 2, 5, 8), (2, 2, 5, 6)], {"enable_gqa": True}),
}


@needs_torch
@pytest.mark.parametrize("case", list(SDPA_CASES), ids=list(SDPA_CASES))
def test_sdpa_matches_torch(case):
    shapes, kw = SDPA_CASES[case]
    _sdpa_pair(shapes, **kw)


@needs_torch
@pytest.mark.parametrize("kind", ["bool", "float", "bool_fully_masked_row", "float_3d"])
def test_sdpa_masks_match_torch(kind):
    rng = np.random.default_rng(8)
    if kind == "float_3d":
        mask = rng.standard_normal((3, 4, 5))
    else:
        mask = rng.random((4, 5)) > 0.3
        mask[:, 0] = True
        if kind == "bool_fully_masked_row":
            mask[1] = False
        if kind == "float":
            mask = np.where(mask, rng.standard_normal((4, 5)), -np.inf)
    _sdpa_pair([(2, 3, 4, 8), (2, 3, 5, 8), (2, 3, 5, 6)], mask)


@needs_torch
def test_sdpa_float_mask_gets_gradient():
    rng = np.random.default_rng(9)
    arrays = [rng.standard_normal(s) for s in [(2, 4, 8), (2, 5, 8), (2, 5, 8), (4, 5)]]
    ours = [distgrad.tensor(a, requires_grad=True) for a in arrays]
    theirs = [torch.tensor(a, requires_grad=True) for a in arrays]
    F.scaled_dot_product_attention(*ours[:3], attn_mask=ours[3]).sum().backward()
    torch.nn.functional.scaled_dot_product_attention(*theirs[:3], attn_mask=theirs[3]).sum() \
        .backward()
    assert_close(ours[3].grad, theirs[3].grad, "grad of attn_mask", atol=1e-10)


def test_sdpa_errors():
    q = distgrad.randn(2, 4, 8)
    with pytest.raises(RuntimeError, match="at least 2 dimensional"):
        F.scaled_dot_product_attention(distgrad.randn(8), q, q)
    with pytest.raises(RuntimeError, match="same dtype"):
        F.scaled_dot_product_attention(q, q.double(), q)
    with pytest.raises(RuntimeError, match="attn_mask dtype"):
        F.scaled_dot_product_attention(q, q, q,
                                       attn_mask=distgrad.zeros(4, 4, dtype=distgrad.int64))
    with pytest.raises(RuntimeError, match="attn_mask of shape \\[4, 3\\]"):
        F.scaled_dot_product_attention(q, q, q, attn_mask=distgrad.zeros(4, 3))
    with pytest.raises(RuntimeError, match="should not be set when is_causal"):
        F.scaled_dot_product_attention(q, q, q, attn_mask=distgrad.zeros(4, 4), is_causal=True)
    with pytest.raises(RuntimeError, match="dropout probability"):
        F.scaled_dot_product_attention(q, q, q, dropout_p=1.5)
    with pytest.raises(RuntimeError, match="do not broadcast"):
        F.scaled_dot_product_attention(q, distgrad.randn(3, 4, 8), distgrad.randn(3, 4, 8))


def test_sdpa_dropout_statistics():
    distgrad.manual_seed(1)
    q = distgrad.zeros(4, 64, 8)  # uniform weights 1/64: outputs are means of the kept values
    v = distgrad.ones(4, 64, 8)
    out = F.scaled_dot_product_attention(q, q, v, dropout_p=0.25).numpy()
    assert abs(out.mean() - 1.0) < 0.02
    assert out.std() > 0.01


# The fused node in float64: finite differences, first and second order, every input,
# with and without the attention-weights output, with a fully masked row.

def _fused_inputs(seed=10):
    rng = np.random.default_rng(seed)
    return [distgrad.tensor(rng.standard_normal(s), requires_grad=True)
            for s in [(2, 2, 3), (2, 3, 3), (2, 3, 2), (2, 3)]]


@pytest.mark.parametrize("need_weights", [False, True])
def test_fused_attention_gradcheck(need_weights):
    inputs = _fused_inputs()
    fn = lambda q, k, v, b: attention(q, k, v, b, 0.5, need_weights=need_weights)  # noqa: E731
    assert gradcheck(fn, inputs)
    assert gradgradcheck(fn, inputs)


@pytest.mark.parametrize("zero_masked_rows", [True, False])
def test_fused_attention_gradcheck_with_masked_positions(zero_masked_rows):
    q, k, v, b = _fused_inputs(11)
    bias = b.detach().clone()
    bias[0, 1] = float("-inf")
    if zero_masked_rows:
        bias[1] = float("-inf")
    fn = lambda q, k, v: attention(q, k, v, bias, 0.5, need_weights=True,  # noqa: E731
                                   zero_masked_rows=zero_masked_rows)
    assert gradcheck(fn, [q, k, v])
    assert gradgradcheck(fn, [q, k, v])


def test_fused_attention_is_one_node():
    q, k, v, b = _fused_inputs()
    out = attention(q, k, v, b)
    assert out.grad_fn.name() == "ScaledDotProductFlashAttentionForCpuBackward0"
    assert [type(n).__name__ for n, _ in out.grad_fn.next_functions] == ["AccumulateGrad"] * 4


def test_weights_output_is_independent_of_saved_probabilities():
    q, k, v, b = _fused_inputs()
    out, w = attention(q, k, v, None, 0.5, need_weights=True)
    expected = distgrad.autograd.grad(out.sum(), q, retain_graph=True)[0].numpy()
    with distgrad.no_grad():
        w.mul_(0)
    np.testing.assert_allclose(distgrad.autograd.grad(out.sum(), q)[0].numpy(), expected)

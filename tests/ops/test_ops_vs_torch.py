"""Every op with a gradient, forward values and gradients against PyTorch (or gradcheck).

Shapes exercise broadcasting; each case is (id, fn(module, *inputs), input shapes).
"""
import numpy as np
import pytest

import distgrad
from distgrad.testing.oracle import check_op, torch

F = "nn.functional"


def fn_of(path):
    def get(m):
        obj = m
        for part in path.split("."):
            obj = getattr(obj, part)
        return obj
    return get


REAL_CASES = [
    ("add", lambda m, a, b: a + b, [(3, 4), (4,)]),
    ("add_alpha", lambda m, a, b: m.add(a, b, alpha=2.5), [(3, 4), (3, 1)]),
    ("radd", lambda m, a: 1.5 + a, [(3,)]),
    ("sub", lambda m, a, b: a - b, [(3, 4), (3, 1)]),
    ("rsub", lambda m, a: 2 - a, [(3,)]),
    ("mul", lambda m, a, b: a * b, [(2, 3, 4), (3, 1)]),
    ("mul_scalar", lambda m, a: a * 3.0, [(3,)]),
    ("div", lambda m, a, b: a / b, [(3, 4), (4,)]),
    ("div_scalar", lambda m, a: a / 4.0, [(3,)]),
    ("rdiv", lambda m, a: 2 / a, [(3, 4)]),
    ("neg", lambda m, a: -a, [(3,)]),
    ("pow_scalar", lambda m, a: a ** 3, [(3, 4)]),
    ("pow_half", lambda m, a: a.abs() ** 0.5, [(3, 4)]),
    ("pow_zero", lambda m, a: a ** 0, [(3,)]),
    ("pow_tensor", lambda m, a, b: a.abs() ** b, [(3, 4), (4,)]),
    ("rpow", lambda m, a: 2 ** a, [(3, 4)]),
    ("reciprocal", lambda m, a: a.reciprocal(), [(3,)]),
    ("exp", lambda m, a: m.exp(a), [(3, 4)]),
    ("log", lambda m, a: m.log(a.abs()), [(3, 4)]),
    ("log1p", lambda m, a: m.log1p(a.abs()), [(3,)]),
    ("expm1", lambda m, a: m.expm1(a), [(3,)]),
    ("sqrt", lambda m, a: m.sqrt(a.abs()), [(3, 4)]),
    ("rsqrt", lambda m, a: m.rsqrt(a.abs()), [(3, 4)]),
    ("abs", lambda m, a: m.abs(a), [(3, 4)]),
    ("sin", lambda m, a: m.sin(a), [(5,)]),
    ("cos", lambda m, a: m.cos(a), [(5,)]),
    ("tanh", lambda m, a: m.tanh(a), [(5,)]),
    ("sigmoid", lambda m, a: m.sigmoid(a), [(5,)]),
    ("relu", lambda m, a: m.relu(a), [(5, 3)]),
    ("gelu", lambda m, a: fn_of(F)(m).gelu(a), [(5, 3)]),
    ("gelu_tanh", lambda m, a: fn_of(F)(m).gelu(a, approximate="tanh"), [(5, 3)]),
    ("clamp", lambda m, a: a.clamp(-0.5, 0.7), [(5, 3)]),
    ("clamp_min", lambda m, a: a.clamp(min=0.1), [(5, 3)]),
    ("clamp_tensor", lambda m, a, lo: a.clamp(min=lo), [(5, 3), (3,)]),
    ("where", lambda m, a, b: m.where(a > 0, a, b), [(3, 4), (4,)]),
    ("where_scalar", lambda m, a: m.where(a > 0, a, 0.0), [(3, 4)]),
    ("maximum", lambda m, a, b: m.maximum(a, b), [(3, 4), (4,)]),
    ("minimum", lambda m, a, b: m.minimum(a, b), [(3, 4), (3, 1)]),
    ("sum_all", lambda m, a: a.sum(), [(3, 4)]),
    ("sum_dim", lambda m, a: a.sum(1), [(3, 4)]),
    ("sum_keepdim", lambda m, a: a.sum(-1, keepdim=True), [(3, 4)]),
    ("sum_dims", lambda m, a: m.sum(a, (0, 2)), [(3, 4, 2)]),
    ("mean", lambda m, a: a.mean(), [(3, 4)]),
    ("mean_dim", lambda m, a: a.mean(0, keepdim=True), [(3, 4)]),
    ("var", lambda m, a: a.var(), [(3, 4)]),
    ("var_dim", lambda m, a: a.var(1, keepdim=True), [(3, 4)]),
    ("var_corr0", lambda m, a: m.var(a, 0, correction=0), [(3, 4)]),
    ("std", lambda m, a: a.std(), [(3, 4)]),
    ("std_dim", lambda m, a: a.std(0), [(3, 4)]),
    ("max_all", lambda m, a: a.max(), [(3, 4)]),
    ("min_all", lambda m, a: a.min(), [(3, 4)]),
    ("max_dim", lambda m, a: a.max(1), [(3, 4)]),
    ("min_dim_keep", lambda m, a: a.min(0, keepdim=True), [(3, 4)]),
    ("amax", lambda m, a: a.amax(1), [(3, 4)]),
    ("amin", lambda m, a: m.amin(a, (0, 1)), [(3, 4)]),
    ("prod", lambda m, a: a.prod(), [(3, 4)]),
    ("prod_dim", lambda m, a: a.prod(1), [(3, 4)]),
    ("logsumexp", lambda m, a: a.logsumexp(1), [(3, 4)]),
    ("logsumexp_keep", lambda m, a: m.logsumexp(a, 0, keepdim=True), [(3, 4)]),
    ("matmul_2d", lambda m, a, b: a @ b, [(3, 4), (4, 5)]),
    ("matmul_batched", lambda m, a, b: m.matmul(a, b), [(2, 3, 4), (2, 4, 5)]),
    ("matmul_bcast", lambda m, a, b: a @ b, [(2, 3, 4), (4, 5)]),
    ("matmul_vec_mat", lambda m, a, b: a @ b, [(4,), (2, 4, 5)]),
    ("matmul_mat_vec", lambda m, a, b: a @ b, [(2, 3, 4), (4,)]),
    ("dot", lambda m, a, b: m.dot(a, b), [(4,), (4,)]),
    ("mm", lambda m, a, b: m.mm(a, b), [(3, 4), (4, 2)]),
    ("bmm", lambda m, a, b: m.bmm(a, b), [(2, 3, 4), (2, 4, 2)]),
    ("einsum_bmm", lambda m, a, b: m.einsum("bij,bjk->bik", a, b), [(2, 3, 4), (2, 4, 2)]),
    ("einsum_implicit", lambda m, a, b: m.einsum("ij,jk", a, b), [(3, 4), (4, 2)]),
    ("einsum_ellipsis", lambda m, a, b: m.einsum("...ij,...j->...i", a, b), [(2, 3, 4), (2, 4)]),
    ("einsum_sum_only_a", lambda m, a, b: m.einsum("ij,k->k", a, b), [(3, 4), (2,)]),
    ("einsum_three", lambda m, a, b, c: m.einsum("ij,jk,kl->il", a, b, c), [(2, 3), (3, 4), (4, 2)]),
    ("einsum_outer", lambda m, a, b: m.einsum("i,j->ij", a, b), [(3,), (4,)]),
    ("linear", lambda m, a, w, b: fn_of(F)(m).linear(a, w, b), [(3, 4), (5, 4), (5,)]),
    ("linear_3d", lambda m, a, w: fn_of(F)(m).linear(a, w), [(2, 3, 4), (5, 4)]),
    ("reshape", lambda m, a: a.reshape(4, 3), [(3, 4)]),
    ("view", lambda m, a: a.view(-1), [(3, 4)]),
    ("transpose", lambda m, a: a.transpose(0, 2), [(3, 4, 2)]),
    ("t", lambda m, a: a.t(), [(3, 4)]),
    ("T", lambda m, a: a.T, [(3, 4)]),
    ("permute", lambda m, a: a.permute(2, 0, 1), [(3, 4, 2)]),
    ("squeeze", lambda m, a: a.squeeze(), [(3, 1, 4)]),
    ("squeeze_dim", lambda m, a: a.squeeze(1), [(3, 1, 4)]),
    ("unsqueeze", lambda m, a: a.unsqueeze(-1), [(3, 4)]),
    ("expand", lambda m, a: a.expand(2, 3, 4), [(3, 1)]),
    ("expand_as", lambda m, a, b: a.expand_as(b), [(1, 4), (3, 4)]),
    ("flatten", lambda m, a: a.flatten(1), [(2, 3, 4)]),
    ("getitem_basic", lambda m, a: a[1:, ::2], [(3, 4)]),
    ("getitem_int", lambda m, a: a[1], [(3, 4)]),
    ("getitem_none_ellipsis", lambda m, a: a[None, ..., 1], [(3, 4)]),
    ("getitem_repeat", lambda m, a: a[[0, 0, 2]], [(3, 4)]),
    ("getitem_mask", lambda m, a: a[a > 0], [(3, 4)]),
    ("getitem_mixed", lambda m, a: a[[0, 2], 1:], [(3, 4)]),
    ("index_select", lambda m, a: a.index_select(1, m.tensor([0, 0, 3])), [(3, 4)]),
    ("gather", lambda m, a: a.gather(1, m.tensor([[0, 0], [1, 3], [2, 2]])), [(3, 4)]),
    ("cat", lambda m, a, b: m.cat([a, b], 1), [(3, 4), (3, 2)]),
    ("stack", lambda m, a, b: m.stack([a, b], 1), [(3, 4), (3, 4)]),
    ("split", lambda m, a: a.split(2, 1), [(3, 4)]),
    ("split_sizes", lambda m, a: m.split(a, [1, 3], 1)[1], [(3, 4)]),
    ("chunk", lambda m, a: a.chunk(2, 0)[0], [(3, 4)]),
    ("unbind", lambda m, a: a.unbind(1)[2], [(3, 4)]),
    ("softmax", lambda m, a: m.softmax(a, 1), [(3, 4)]),
    ("softmax_dim0", lambda m, a: m.softmax(a, 0), [(3, 4)]),
    ("log_softmax", lambda m, a: m.log_softmax(a, -1), [(3, 4)]),
    ("masked_fill", lambda m, a: a.masked_fill(a > 0.5, 0.0), [(3, 4)]),
    ("tril", lambda m, a: m.tril(a), [(3, 4)]),
    ("tril_diagonal", lambda m, a: a.tril(-1), [(2, 4, 3)]),
    ("triu_diagonal", lambda m, a: m.triu(a, diagonal=2), [(4, 5)]),
    ("triu_", lambda m, a: (a * 1).triu_(1), [(3, 3)]),
    ("flip", lambda m, a: a.flip(0), [(3, 4)]),
    ("sort", lambda m, a: a.sort(1), [(3, 4)]),
    ("sort_desc", lambda m, a: m.sort(a, 0, descending=True), [(3, 4)]),
    ("argsort", lambda m, a: a * m.argsort(a, 1).to(a.dtype), [(3, 4)]),
    ("topk", lambda m, a: a.topk(2, 1), [(3, 4)]),
    ("topk_smallest", lambda m, a: m.topk(a, 2, 0, largest=False), [(3, 4)]),
    ("cumsum", lambda m, a: a.cumsum(1), [(3, 4)]),
    ("repeat", lambda m, a: a.repeat(2, 1), [(3, 4)]),
    ("norm", lambda m, a: a.norm(), [(3, 4)]),
    ("clone", lambda m, a: a.clone() * 2, [(3,)]),
    ("to_float32", lambda m, a: a.to(m.float32) * 2, [(3,)]),
    ("mse_loss", lambda m, a, b: fn_of(F)(m).mse_loss(a, b), [(3, 4), (3, 4)]),
    ("mse_sum", lambda m, a, b: fn_of(F)(m).mse_loss(a, b, reduction="sum"), [(3, 4), (3, 4)]),
    ("cross_entropy", lambda m, a: fn_of(F)(m).cross_entropy(a, m.tensor([0, 2, 1])), [(3, 4)]),
    ("cross_entropy_smooth", lambda m, a: fn_of(F)(m).cross_entropy(
        a, m.tensor([0, 2, 1]), label_smoothing=0.1), [(3, 4)]),
    ("cross_entropy_probs", lambda m, a, t: fn_of(F)(m).cross_entropy(a, t.softmax(1)),
     [(3, 4), (3, 4)]),
    ("cross_entropy_ignore", lambda m, a: fn_of(F)(m).cross_entropy(
        a, m.tensor([0, -100, 1])), [(3, 4)]),
    ("cross_entropy_nd", lambda m, a: fn_of(F)(m).cross_entropy(
        a, m.tensor([[0, 1], [2, 2]])), [(2, 3, 2)]),
    ("nll_loss_weight", lambda m, a: fn_of(F)(m).nll_loss(
        a.log_softmax(1), m.tensor([0, 2, 1]), weight=m.tensor([1.0, 2.0, 0.5, 1.0],
                                                              dtype=m.float64)), [(3, 4)]),
    ("layer_norm", lambda m, a, w, b: fn_of(F)(m).layer_norm(a, (4,), w, b), [(3, 4), (4,), (4,)]),
    ("layer_norm_2d", lambda m, a: fn_of(F)(m).layer_norm(a, (3, 4)), [(2, 3, 4)]),
    ("embedding", lambda m, w: fn_of(F)(m).embedding(m.tensor([[0, 2], [2, 1]]), w), [(3, 4)]),
    ("embedding_pad", lambda m, w: fn_of(F)(m).embedding(m.tensor([0, 2, 2]), w, padding_idx=2),
     [(3, 4)]),
    ("silu", lambda m, a: fn_of(F)(m).silu(a), [(5,)]),
    ("softplus", lambda m, a: fn_of(F)(m).softplus(a), [(5,)]),
    ("leaky_relu", lambda m, a: fn_of(F)(m).leaky_relu(a, 0.1), [(5,)]),
    ("bce_logits", lambda m, a, t: fn_of(F)(m).binary_cross_entropy_with_logits(a, t.sigmoid()),
     [(3, 4), (3, 4)]),
]


# Conventions, not derivatives: finite differences cannot check them, so without the
# oracle they are asserted directly (test_embedding_padding_row_gets_no_gradient).
CONVENTIONS = {"embedding_pad"}


@pytest.mark.parametrize("name,fn,shapes", REAL_CASES, ids=[c[0] for c in REAL_CASES])
def test_real_op(name, fn, shapes):
    _skip_convention_without_oracle(name)
    check_op(fn, shapes)


def _skip_convention_without_oracle(name):
    if torch is None and name in CONVENTIONS:
        pytest.skip("a convention, not a derivative: needs the oracle")


def test_embedding_padding_row_gets_no_gradient():
    w = distgrad.ones(3, 2, requires_grad=True)
    distgrad.nn.functional.embedding(distgrad.tensor([0, 2, 2, 1]), w, padding_idx=2).sum().backward()
    assert w.grad.tolist() == [[1.0, 1.0], [1.0, 1.0], [0.0, 0.0]]


COMPLEX_CASES = [
    ("mul", lambda m, a, b: a * b, [(3,), (3,)]),
    ("div", lambda m, a, b: a / b, [(3,), (3,)]),
    ("add_bcast", lambda m, a, b: a + b, [(2, 3), (3,)]),
    ("abs", lambda m, a: a.abs(), [(3,)]),
    ("exp", lambda m, a: a.exp(), [(3,)]),
    ("log", lambda m, a: a.log(), [(3,)]),
    ("sqrt", lambda m, a: a.sqrt(), [(3,)]),
    ("sin", lambda m, a: a.sin(), [(3,)]),
    ("tanh", lambda m, a: a.tanh(), [(3,)]),
    ("pow", lambda m, a: a ** 3, [(3,)]),
    ("angle", lambda m, a: a.angle(), [(3,)]),
    ("real_imag", lambda m, a: a.real * 2 + a.imag, [(3,)]),
    ("conj", lambda m, a: a.conj() * a, [(3,)]),
    ("matmul", lambda m, a, b: a @ b, [(2, 3), (3, 2)]),
    ("einsum", lambda m, a, b: m.einsum("ij,jk->ik", a, b), [(2, 3), (3, 2)]),
    ("sum", lambda m, a: a.sum(0), [(2, 3)]),
    ("mean", lambda m, a: a.mean(), [(2, 3)]),
    ("var", lambda m, a: a.var(), [(2, 3)]),
    ("prod", lambda m, a: a.prod(1), [(2, 3)]),
    ("reshape_index", lambda m, a: a.reshape(3, 2)[1:], [(2, 3)]),
    ("cat", lambda m, a, b: m.cat([a, b]), [(2,), (3,)]),
]


@pytest.mark.parametrize("name,fn,shapes", COMPLEX_CASES, ids=[c[0] for c in COMPLEX_CASES])
def test_complex_op(name, fn, shapes):
    check_op(fn, shapes, dtype=np.complex128)


def test_real_loss_of_complex_parameter_descends():
    """PyTorch's convention: the gradient of a real loss is the steepest-ascent direction."""
    z = distgrad.tensor([1 + 2j, -0.5 + 0.3j], dtype=distgrad.complex128, requires_grad=True)
    loss = (z.abs() ** 2).sum()
    loss.backward()
    np.testing.assert_allclose(z.grad.numpy(), 2 * z.detach().numpy())
    with distgrad.no_grad():
        z2 = z - 0.1 * z.grad
    assert (z2.abs() ** 2).sum().item() < loss.item()


def test_complex_to_real_input_gets_real_gradient():
    x = distgrad.tensor([1.0, 2.0], dtype=distgrad.float64, requires_grad=True)
    y = (x * (1 + 1j)).abs().sum()
    y.backward()
    assert x.grad.dtype == distgrad.float64
    np.testing.assert_allclose(x.grad.numpy(), np.sqrt(2) * np.ones(2))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_float32_and_float64_match_torch(dtype):
    check_op(lambda m, a, b: (a @ b).tanh().sum(1), [(3, 4), (4, 2)], dtype=dtype,
             atol=1e-5, rtol=1e-4)


def _grad_of(fn, values, dtype=distgrad.float64):
    x = distgrad.tensor(values, dtype=dtype, requires_grad=True)
    fn(x).sum().backward()
    return x.grad.tolist()


def test_non_differentiable_points_follow_pytorch():
    """PyTorch's conventions, written out (finite differences cannot check kinks)."""
    inf = float("inf")
    assert _grad_of(distgrad.relu, [0.0, 1.0, -1.0]) == [0.0, 1.0, 0.0]
    assert _grad_of(lambda x: x.abs(), [0.0, 2.0, -2.0]) == [0.0, 1.0, -1.0]
    assert _grad_of(lambda x: x.sqrt(), [0.0, 4.0]) == [inf, 0.25]
    assert _grad_of(lambda x: x.max(), [1.0, 3.0, 3.0, 2.0]) == [0.0, 0.5, 0.5, 0.0]
    assert _grad_of(lambda x: x.amax(0), [[1.0, 3.0], [1.0, 2.0]]) == [[0.5, 1.0], [0.5, 0.0]]
    assert _grad_of(lambda x: x.min(), [1.0, 1.0, 3.0]) == [0.5, 0.5, 0.0]
    assert _grad_of(lambda x: x.clamp(0.0, 1.0), [0.0, 1.0, 0.5, 2.0, -1.0]) == \
        [1.0, 1.0, 1.0, 0.0, 0.0]
    assert _grad_of(lambda x: distgrad.maximum(x, distgrad.tensor([1.0, 3.0],
                                                                  dtype=distgrad.float64)),
                    [1.0, 2.0]) == [0.5, 0.0]
    assert _grad_of(lambda x: x.prod(), [2.0, 0.0, 3.0]) == [0.0, 6.0, 0.0]
    assert _grad_of(lambda x: x.prod(0), [[2.0, 0.0], [0.0, 1.0]]) == [[0.0, 1.0], [2.0, 0.0]]
    assert _grad_of(lambda x: x ** 2.0, [0.0, 0.0]) == [0.0, 0.0]
    if torch is not None:  # and the same numbers from the oracle
        zeros = np.zeros(3)
        for fn, values in [(lambda m, a: m.relu(a), zeros), (lambda m, a: a.abs(), zeros),
                           (lambda m, a: a.sqrt(), zeros),
                           (lambda m, a: a.max(), np.array([1.0, 3.0, 3.0, 2.0])),
                           (lambda m, a: a.amax(0), np.array([[1.0, 3.0], [1.0, 2.0]])),
                           (lambda m, a: a.clamp(0.0, 1.0), np.array([0.0, 1.0, 0.5, 2.0])),
                           (lambda m, a: a.prod(0), np.array([[2.0, 0.0], [0.0, 1.0]]))]:
            check_op(fn, [values])


def test_integer_promotion_matches_torch():
    ints = np.array([1, 2, 3], dtype=np.int64)
    check_op(lambda m, a, b: a * b, [ints, (3,)], requires_grad=[False, True], dtype=np.float32)
    check_op(lambda m, a: a / 2, [ints], grad=False)
    check_op(lambda m, a: a + 1.5, [ints], grad=False)
    check_op(lambda m, a, b: a + b, [np.array(2.0), (3,)], dtype=np.float32,
             requires_grad=[True, True])


FLOAT32_CASES = [c for c in REAL_CASES if c[0] != "nll_loss_weight"]  # that case builds float64


@pytest.mark.parametrize("name,fn,shapes", FLOAT32_CASES, ids=[c[0] for c in FLOAT32_CASES])
def test_real_op_float32_keeps_dtypes(name, fn, shapes):
    """The default dtype: forward dtypes, gradient dtypes and values as PyTorch's."""
    _skip_convention_without_oracle(name)
    check_op(fn, shapes, dtype=np.float32, atol=1e-4, rtol=1e-3)


@pytest.mark.parametrize("name,fn,shapes", COMPLEX_CASES, ids=[c[0] for c in COMPLEX_CASES])
def test_complex64_op(name, fn, shapes):
    check_op(fn, shapes, dtype=np.complex64, atol=1e-4, rtol=1e-3)

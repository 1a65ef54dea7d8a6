"""``diag``, ``diag_embed``, ``diagflat`` and indexing with a ``range``, against PyTorch."""
import numpy as np
import pytest

import distgrad
from distgrad.testing.oracle import check_op, torch
from support.node_names import assert_same_node_name

CASES = [
    ("diag_vector", lambda m, v: m.diag(v), [(4,)]),
    ("diag_vector_above", lambda m, v: m.diag(v, 2), [(3,)]),
    ("diag_vector_below", lambda m, v: v.diag(-1), [(3,)]),
    ("diag_matrix", lambda m, a: m.diag(a), [(3, 4)]),
    ("diag_matrix_above", lambda m, a: m.diag(a, 1), [(4, 3)]),
    ("diag_matrix_below", lambda m, a: a.diag(-2), [(4, 3)]),
    ("diag_matrix_outside", lambda m, a: m.diag(a, 7), [(4, 3)]),
    ("diag_embed", lambda m, a: m.diag_embed(a), [(2, 3)]),
    ("diag_embed_offset", lambda m, a: m.diag_embed(a, -1), [(2, 3)]),
    ("diagflat", lambda m, a: m.diagflat(a), [(2, 2)]),
    ("diagflat_offset", lambda m, a: a.diagflat(1), [(3,)]),
    ("index_range", lambda m, a: a[range(2)], [(3, 4)]),
    ("index_range_step", lambda m, a: a[:, range(1, 4, 2)], [(3, 4)]),
    ("index_ranges", lambda m, a: a[range(2), range(1, 3)], [(3, 4)]),
    ("index_empty_range", lambda m, a: a[range(0)], [(3, 4)]),
]


@pytest.mark.parametrize("name,fn,shapes", CASES, ids=[c[0] for c in CASES])
def test_values_and_gradients_match_pytorch(name, fn, shapes):
    check_op(fn, shapes)


@pytest.mark.parametrize("name,fn,shapes", CASES, ids=[c[0] for c in CASES])
def test_node_names_match_pytorch(name, fn, shapes):
    assert_same_node_name(fn, shapes)


def test_gradients_of_gradients():
    v = distgrad.tensor(np.arange(1.0, 4.0), requires_grad=True)
    a = distgrad.tensor(np.arange(12.0).reshape(3, 4) / 7, requires_grad=True)
    assert distgrad.autograd.gradgradcheck(lambda x: distgrad.diag(x) ** 2, (v,))
    assert distgrad.autograd.gradgradcheck(lambda x: distgrad.diag(x, 1) ** 3, (a,))


def test_diag_of_a_3d_tensor_raises_as_pytorch():
    for m in [distgrad] + ([torch] if torch is not None else []):
        with pytest.raises(RuntimeError, match="Supports 1D or 2D tensors. Got 3D"):
            m.diag(m.ones(2, 2, 2))


def test_setitem_with_a_range():
    def fill(m):
        y = m.zeros(3, 4)
        y[range(2)] = 1
        y[:, range(0, 4, 3)] = 2
        return y.tolist()
    ours = fill(distgrad)
    assert ours[2] == [2.0, 0.0, 0.0, 2.0]
    if torch is not None:
        assert ours == fill(torch)

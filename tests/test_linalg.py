"""``torch.linalg``: multi_dot and the norms, values and gradients against PyTorch."""
import math

import numpy as np
import pytest

import distgrad
from distgrad.testing.oracle import check_op, torch
from support.node_names import assert_same_node_name

CASES = [
    ("multi_dot_2", lambda m, a, b: m.linalg.multi_dot([a, b]), [(3, 4), (4, 2)]),
    ("multi_dot_3", lambda m, a, b, c: m.linalg.multi_dot((a, b, c)), [(4, 6), (6, 5), (5, 7)]),
    ("multi_dot_3_right_first", lambda m, a, b, c: m.linalg.multi_dot([a, b, c]),
     [(8, 2), (2, 9), (9, 1)]),
    ("multi_dot_chain", lambda m, a, b, c, d, e: m.linalg.multi_dot([a, b, c, d, e]),
     [(3, 3), (3, 3), (3, 3), (3, 3), (3, 3)]),
    ("multi_dot_vectors", lambda m, a, b, c: m.linalg.multi_dot([a, b, c]), [(4,), (4, 5), (5,)]),
    ("multi_dot_row", lambda m, a, b, c: m.linalg.multi_dot([a, b, c]), [(4,), (4, 5), (5, 3)]),
    ("vector_norm", lambda m, a: m.linalg.vector_norm(a), [(3, 4)]),
    ("vector_norm_dim", lambda m, a: m.linalg.vector_norm(a, dim=1, keepdim=True), [(3, 4)]),
    ("vector_norm_1", lambda m, a: m.linalg.vector_norm(a, 1, dim=(0, 1)), [(3, 4)]),
    ("vector_norm_3", lambda m, a: m.linalg.vector_norm(a, 3, dim=0), [(3, 4)]),
    ("vector_norm_half", lambda m, a: m.linalg.vector_norm(a, 0.5, dim=-1), [(3, 4)]),
    ("vector_norm_1_5", lambda m, a: m.linalg.vector_norm(a, 1.5), [(5,)]),
    ("vector_norm_inf", lambda m, a: m.linalg.vector_norm(a, math.inf, dim=1), [(3, 4)]),
    ("vector_norm_neg_inf", lambda m, a: m.linalg.vector_norm(a, -math.inf), [(3, 4)]),
    ("vector_norm_0", lambda m, a: m.linalg.vector_norm(a, 0), [(3, 4)]),
    ("matrix_norm_fro", lambda m, a: m.linalg.matrix_norm(a), [(2, 3, 4)]),
    ("matrix_norm_1", lambda m, a: m.linalg.matrix_norm(a, 1), [(3, 4)]),
    ("matrix_norm_inf", lambda m, a: m.linalg.matrix_norm(a, -math.inf, keepdim=True),
     [(2, 3, 4)]),
    ("norm", lambda m, a: m.linalg.norm(a), [(2, 3, 4)]),
    ("norm_ord_dim", lambda m, a: m.linalg.norm(a, 1, dim=0), [(3, 4)]),
    ("norm_matrix", lambda m, a: m.linalg.norm(a, "fro"), [(3, 4)]),
    ("norm_matrix_inf", lambda m, a: m.linalg.norm(a, math.inf), [(3, 4)]),
]


@pytest.mark.parametrize("name,fn,shapes", CASES, ids=[c[0] for c in CASES])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_values_and_gradients_match_pytorch(name, fn, shapes, dtype):
    check_op(fn, shapes, dtype=dtype, atol=1e-4 if dtype == np.float32 else 1e-6)


@pytest.mark.parametrize("name,fn,shapes", CASES, ids=[c[0] for c in CASES])
def test_node_names_match_pytorch(name, fn, shapes):
    assert_same_node_name(fn, shapes)


def test_vector_norm_of_a_complex_tensor():
    check_op(lambda m, a: m.linalg.vector_norm(a), [(3, 2)], dtype=np.complex128)


@pytest.mark.parametrize("call,message", [
    (lambda m: m.linalg.multi_dot([m.ones(2, 2)]), "expected at least 2 tensors but got 1"),
    (lambda m: m.linalg.multi_dot([m.ones(2, 3), m.ones(2, 3)]),
     r"tensors 0 and 1 with shapes \[2, 3\] and \[2, 3\] cannot be multiplied"),
    (lambda m: m.linalg.multi_dot([m.ones(2, 2), m.ones(2, 2, 2), m.ones(2, 2)]),
     "tensor 1 must be 2D but got 3D"),
    (lambda m: m.linalg.multi_dot([m.ones(2, 2, 2), m.ones(2, 2)]),
     "the first tensor must be 1D or 2D but got 3D"),
    (lambda m: m.linalg.multi_dot([m.ones(2, 2), m.ones(2, 2, dtype=m.float64)]),
     "all tensors must have be the same dtype"),
    (lambda m: m.linalg.vector_norm(m.ones(3, dtype=m.int64)), "floating point or complex"),
    (lambda m: m.linalg.vector_norm(m.ones(0), -1), "on an empty tensor"),
    (lambda m: m.linalg.norm(m.ones(2, 2, 2), 2), "must be 1D or 2D"),
])
def test_errors_match_pytorch(call, message):
    for m in [distgrad] + ([torch] if torch is not None else []):
        with pytest.raises(RuntimeError, match=message):
            call(m)


def test_norms_that_need_singular_values_raise():
    with pytest.raises(NotImplementedError, match="singular values"):
        distgrad.linalg.matrix_norm(distgrad.ones(3, 3), 2)

"""Tensors print as PyTorch prints them (``torch/_tensor_str.py``'s rules)."""
import math

import numpy as np
import pytest

import distgrad
from distgrad.testing.oracle import torch

CASES = {
    "scalar_fixed": lambda m: m.tensor(0.002),
    "fixed": lambda m: m.tensor([0.002, 1.5]),
    "int_mode": lambda m: m.tensor([1.0, 2.0]),
    "requires_grad": lambda m: m.tensor([1.0, 2.0], requires_grad=True),
    "grad_fn": lambda m: m.ones(3, requires_grad=True) * 2,
    "sci_small": lambda m: m.tensor([1e-6, 1.0]),
    "sci_large": lambda m: m.tensor([1e9, 1.0]),
    "sci_boundary": lambda m: m.tensor([1e-4, 1.0]),
    "int64": lambda m: m.tensor([1, 2, 3]),
    "uint8": lambda m: m.zeros(3, dtype=m.uint8),
    "bool": lambda m: m.tensor([True, False]),
    "matrix": lambda m: m.tensor([[1.5, -2.25], [3.0, 4.0]]),
    "summarized": lambda m: m.arange(2000.0),
    "summarized_2d": lambda m: m.arange(2000).reshape(40, 50),
    "wrapped": lambda m: m.linspace(0, 1, 30),
    "empty": lambda m: m.zeros(0),
    "empty_2d": lambda m: m.zeros(0, 3),
    "empty_int": lambda m: m.zeros(0, dtype=m.int64),
    "float64": lambda m: m.zeros(2, dtype=m.float64),
    "float64_scalar": lambda m: m.tensor(3.0, dtype=m.float64),
    "non_finite": lambda m: m.tensor([float("nan"), float("inf"), -math.inf, 1.0]),
    "complex": lambda m: m.tensor([1 + 2j, -3.5 - 0.5j]),
    "zeros_signed": lambda m: m.tensor([0.0, -0.0]),
    "3d": lambda m: m.ones(2, 3, 4),
    "parameter": lambda m: m.nn.Parameter(m.ones(2)),
    "sparse": lambda m: m.sparse_coo_tensor([[0, 1, 1], [2, 0, 2]], [3.2, 4.1, 5.3], (3, 3),
                                           requires_grad=True),
    "sparse_empty": lambda m: m.sparse_coo_tensor(m.zeros(2, 0, dtype=m.int64), m.zeros(0),
                                                  (3, 3)),
    "sparse_hybrid": lambda m: m.sparse_coo_tensor([[0, 1]], [[1.0, 2.0], [3.0, 4.0]], (3, 2),
                                                   dtype=m.float64),
    "float16": lambda m: m.zeros(3, dtype=m.float16) + 0.1,
}


@pytest.mark.parametrize("name", CASES)
def test_repr_matches_pytorch(name):
    ours = repr(CASES[name](distgrad))
    if torch is None:
        assert ours.startswith(("tensor(", "Parameter containing:")), ours
        return
    assert ours == repr(CASES[name](torch)).replace("torch.", "distgrad.")


@pytest.mark.parametrize("value,text", [
    (0.002, "tensor(0.0020)"), (2.0, "tensor(2.)"), (1e-5, "tensor(1.0000e-05)"),
    ([1.0, 2.5], "tensor([1.0000, 2.5000])"), (7, "tensor(7)"),
])
def test_known_strings(value, text):
    assert repr(distgrad.tensor(value)) == text


def test_printoptions():
    x = distgrad.tensor([1.12345, 2.0])
    with distgrad._tensor_str.printoptions(precision=2):
        assert repr(x) == "tensor([1.12, 2.00])"
    assert repr(x) == "tensor([1.1235, 2.0000])"
    distgrad.set_printoptions(threshold=5)
    try:
        assert repr(distgrad.arange(10)) == "tensor([0, 1, 2,  ..., 7, 8, 9])"
    finally:
        distgrad.set_printoptions(profile="default")
    assert repr(distgrad.arange(10)) == "tensor([0, 1, 2, 3, 4, 5, 6, 7, 8, 9])"


def test_str_and_format_agree_with_pytorch():
    x = distgrad.tensor(np.float32(1.1))
    assert str(x) == repr(x) == "tensor(1.1000)"
    assert f"{x:.3f}" == "1.100"

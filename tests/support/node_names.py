"""The ``grad_fn`` name an op gives in distgrad and in PyTorch, for tests that compare them."""
import pytest

import distgrad
from distgrad.testing.oracle import torch


def assert_same_node_name(fn, shapes):
    """``type(fn(m, *inputs).grad_fn).__name__`` agrees for m = distgrad and torch (float64
    inputs of ``shapes`` that require grad); skips without torch."""
    if torch is None:
        pytest.skip("torch is not installed")
    names = []
    for m in (distgrad, torch):
        xs = [m.ones(*s, dtype=m.float64, requires_grad=True) for s in shapes]
        names.append(type(fn(m, *xs).grad_fn).__name__)
    assert names[0] == names[1]

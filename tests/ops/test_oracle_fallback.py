"""Without PyTorch, check_op falls back to finite differences instead of checking nothing."""
import numpy as np
import pytest

import distgrad
from distgrad.testing import oracle


def test_check_op_uses_gradcheck_when_torch_is_absent(monkeypatch):
    monkeypatch.setattr(oracle, "torch", None)
    oracle.check_op(lambda m, a, b: (a @ b).tanh().sum(0), [(3, 4), (4, 2)])
    oracle.check_op(lambda m, a: a.abs() ** 3, [(3,)], dtype=np.complex128)


def test_fallback_catches_a_wrong_gradient(monkeypatch):
    monkeypatch.setattr(oracle, "torch", None)

    class Wrong(distgrad.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x * 3

        @staticmethod
        def backward(ctx, g):
            return g * 2

    with pytest.raises(distgrad.autograd.GradcheckError):
        oracle.check_op(lambda m, a: Wrong.apply(a), [(3,)])

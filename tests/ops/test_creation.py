"""Factories and the random generator."""
import numpy as np
import pytest

import distgrad


def test_factories_shapes_and_dtypes():
    assert distgrad.zeros(2, 3).shape == (2, 3) and distgrad.zeros((2, 3)).shape == (2, 3)
    assert distgrad.ones(2, dtype=distgrad.float64).dtype is distgrad.float64
    assert distgrad.empty(4).shape == (4,)
    f = distgrad.full((2,), 7)
    assert f.dtype is distgrad.int64 and f.tolist() == [7, 7]
    assert distgrad.full((2,), 1.5).dtype is distgrad.float32
    assert distgrad.arange(5).dtype is distgrad.int64 and distgrad.arange(5).tolist() == [0, 1, 2, 3, 4]
    assert distgrad.arange(0, 1, 0.5).dtype is distgrad.float32
    assert distgrad.linspace(0, 1, 5).shape == (5,)
    assert distgrad.eye(3).sum().item() == 3
    assert distgrad.rand(2, 2).shape == (2, 2) and distgrad.randn(3).dtype is distgrad.float32
    r = distgrad.randint(0, 5, (10,))
    assert r.dtype is distgrad.int64 and r.min().item() >= 0 and r.max().item() < 5
    x = distgrad.ones(2, 3, dtype=distgrad.float64)
    for like in (distgrad.zeros_like, distgrad.ones_like, distgrad.empty_like, distgrad.rand_like,
                 distgrad.randn_like):
        y = like(x)
        assert y.shape == (2, 3) and y.dtype is distgrad.float64
    assert distgrad.full_like(x, 3).tolist() == [[3.0] * 3] * 2
    assert distgrad.zeros(2, requires_grad=True).requires_grad
    with pytest.raises(RuntimeError, match="negative dimension"):
        distgrad.zeros(-1)


def test_manual_seed_makes_runs_repeatable():
    distgrad.manual_seed(123)
    a = distgrad.randn(4)
    distgrad.manual_seed(123)
    b = distgrad.randn(4)
    assert a.equal(b)
    assert distgrad.initial_seed() == 123


def test_complex_dtypes():
    z = distgrad.randn(3, dtype=distgrad.complex64)
    assert z.dtype is distgrad.complex64 and z.is_complex()
    assert z.real.dtype is distgrad.float32
    assert distgrad.zeros(2, dtype=distgrad.complex128).dtype is distgrad.complex128


def test_tensor_copies_and_from_numpy_does_not():
    arr = np.ones(2)
    t = distgrad.tensor(arr)
    arr[0] = 3
    assert t[0].item() == 1.0
    assert distgrad.from_numpy(arr)[0].item() == 3
    with pytest.raises(TypeError):
        distgrad.from_numpy(np.array(["a"]))

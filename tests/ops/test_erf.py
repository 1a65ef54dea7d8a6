"""The array-wide erf (ops/erf.py) against math.erf, and the ops built on it against PyTorch."""
import math

import numpy as np
import pytest

import distgrad
from distgrad.ops.erf import erf

# Every piece of the approximation and its edges, tails, zeros, infinities and nan.
_EDGES = [0.0, -0.0, 5e-324, 1e-300, 1e-9, 0.84375, np.nextafter(0.84375, 0), 1.25,
          np.nextafter(1.25, 0), 1 / 0.35, np.nextafter(1 / 0.35, 0), 6.0, np.nextafter(6.0, 0),
          27.0, 1e300, np.inf]


def _points():
    rng = np.random.default_rng(0)
    xs = np.concatenate([rng.standard_normal(20000) * 2, rng.uniform(-7, 7, 20000),
                         np.linspace(-8, 8, 20001), _EDGES, np.negative(_EDGES)])
    return xs


def test_float64_is_within_one_ulp_of_math_erf():
    xs = _points()
    ref = np.array([math.erf(v) for v in xs])
    got = erf(xs)
    assert got.dtype == np.float64 and got.shape == xs.shape
    ulps = np.abs(got - ref) / np.spacing(np.abs(ref))
    assert ulps.max() <= 1.0
    rel = np.abs(got - ref) / np.maximum(np.abs(ref), np.finfo(np.float64).tiny)
    assert rel.max() <= 2.3e-16
    assert np.signbit(erf(np.array([-0.0]))[0])


def test_float32_is_within_one_float32_ulp():
    xs = _points()
    xs = xs[(np.abs(xs) < 1e30) | np.isinf(xs)].astype(np.float32)
    ref = np.array([math.erf(v) for v in xs.astype(np.float64)])
    got = erf(xs)
    assert got.dtype == np.float32
    ulps = np.abs(got.astype(np.float64) - ref) / np.spacing(np.abs(ref).astype(np.float32))
    assert ulps.max() <= 1.0


def test_nan_shapes_and_dtypes():
    got = erf(np.array([np.nan, 1.0, -np.nan, 3.0]))
    assert np.isnan(got[[0, 2]]).all() and not np.isnan(got[[1, 3]]).any()
    assert erf(np.array(0.5)).shape == ()
    assert erf(np.zeros((0, 3))).shape == (0, 3)
    assert erf(np.ones((2, 3), np.float16)).dtype == np.float16
    strided = np.linspace(-3, 3, 24).reshape(4, 6)[:, ::2]
    assert np.array_equal(erf(strided), np.array([[math.erf(v) for v in row] for row in strided]))


def test_complex_raises_as_pytorch():
    with pytest.raises(NotImplementedError, match="ComplexFloat"):
        erf(np.ones(2, np.complex64))


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("op", ["erf", "gelu", "sigmoid"])
def test_against_torch_on_a_wide_range(op, dtype):
    torch = pytest.importorskip("torch")
    x = np.concatenate([np.linspace(-40, 40, 4001),
                        np.random.default_rng(1).standard_normal(4000)]).astype(dtype)
    g = np.random.default_rng(2).standard_normal(x.shape).astype(dtype)
    results = []
    for lib in (distgrad, torch):
        t = lib.tensor(x, requires_grad=True)
        fn = {"erf": lib.erf, "gelu": lib.nn.functional.gelu, "sigmoid": lib.sigmoid}[op]
        y = fn(t)
        y.backward(lib.tensor(g))
        results.append((y.detach().numpy(), t.grad.numpy()))
    (y_dg, g_dg), (y_t, g_t) = results
    assert y_dg.dtype == y_t.dtype and g_dg.dtype == g_t.dtype
    # gelu(x) = x * (1 + erf(x / sqrt 2)) / 2 cancels for negative x in both libraries: an
    # ulp of erf near -1 is an error of about |x| * eps in the result.
    eps = np.finfo(dtype).eps
    bound = 4 * eps * (np.abs(y_t) + np.abs(x.astype(np.float64)) + 1)
    assert (np.abs(y_dg - y_t.astype(np.float64)) <= bound).all()
    assert (np.abs(g_dg - g_t.astype(np.float64)) <= bound * (1 + np.abs(g))).all()

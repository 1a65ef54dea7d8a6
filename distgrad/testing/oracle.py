"""Run one computation in distgrad and in PyTorch and compare values and gradients.

The project's op tests use :func:`check_op`; where PyTorch is not installed the
same call falls back to a finite-difference ``gradcheck`` in float64, so a test
never silently checks nothing.

    check_op(lambda m, a, b: m.maximum(a, b), [(3, 4), (4,)])

The callable receives the library module (``distgrad`` or ``torch``) first, then
the input tensors, so one lambda serves both.
"""
import numpy as np

import distgrad
from ..autograd._internal import array_of

try:  # PyTorch is the oracle, never a dependency.
    import torch
except ImportError:  # pragma: no cover - exercised where torch is absent
    torch = None

__all__ = ["torch", "check_op", "make_inputs", "to_torch", "from_torch"]

_TORCH_DTYPES = {}


def _torch_dtype(np_dtype):
    if not _TORCH_DTYPES and torch is not None:
        _TORCH_DTYPES.update({np.dtype(np.float32): torch.float32,
                              np.dtype(np.float64): torch.float64,
                              np.dtype(np.complex64): torch.complex64,
                              np.dtype(np.complex128): torch.complex128,
                              np.dtype(np.int64): torch.int64, np.dtype(np.bool_): torch.bool})
    return _TORCH_DTYPES[np.dtype(np_dtype)]


def make_inputs(shapes, dtype=np.float64, seed=0, low=-2.0, high=2.0):
    """Random arrays: a shape gives uniform values in [low, high); an array passes through."""
    rng = np.random.default_rng(seed)
    out = []
    for s in shapes:
        if isinstance(s, np.ndarray):
            out.append(s)
            continue
        a = rng.uniform(low, high, size=s)
        if np.dtype(dtype).kind == "c":
            a = a + 1j * rng.uniform(low, high, size=s)
        out.append(np.asarray(a, dtype=dtype))
    return out


def to_torch(array, requires_grad=False):
    t = torch.from_numpy(np.array(array, copy=True))
    if requires_grad:
        t.requires_grad_(True)
    return t


def from_torch(t):
    return t.detach().numpy()


def _flat(out):
    return list(out) if isinstance(out, (tuple, list)) else [out]


def check_op(fn, shapes, torch_fn=None, *, dtype=np.float64, seed=0, low=-2.0, high=2.0,
             atol=1e-6, rtol=1e-5, grad=True, requires_grad=None, grad_seed=1):
    """Compare ``fn(distgrad, *xs)`` with ``fn(torch, *xs)`` (or ``torch_fn``): values and grads.

    ``requires_grad`` lists, per input, whether it is differentiated (default: the
    floating inputs). Returns the distgrad outputs.
    """
    arrays = make_inputs(shapes, dtype, seed, low, high)
    if requires_grad is None:
        requires_grad = [a.dtype.kind in "fc" for a in arrays]
    dg_in = [distgrad.tensor(a, requires_grad=grad and rg) for a, rg in zip(arrays, requires_grad)]
    dg_out = _flat(fn(distgrad, *dg_in))
    if torch is None:
        if grad:
            _finite_difference_check(fn, arrays, requires_grad, atol, rtol)
        return dg_out
    th_in = [to_torch(a, requires_grad=grad and rg) for a, rg in zip(arrays, requires_grad)]
    th_out = _flat((torch_fn or fn)(torch, *th_in))
    assert len(dg_out) == len(th_out), f"{len(dg_out)} outputs vs torch's {len(th_out)}"
    for i, (d, t) in enumerate(zip(dg_out, th_out)):
        dv = array_of(d) if isinstance(d, distgrad.Tensor) else np.asarray(d)
        tv = from_torch(t) if isinstance(t, torch.Tensor) else np.asarray(t)
        assert dv.shape == tv.shape, f"output {i}: shape {dv.shape} vs torch {tv.shape}"
        assert dv.dtype == tv.dtype, f"output {i}: dtype {dv.dtype} vs torch {tv.dtype}"
        np.testing.assert_allclose(dv, tv, atol=atol, rtol=rtol, equal_nan=True,
                                   err_msg=f"forward output {i}")
    if not grad:
        return dg_out
    rng = np.random.default_rng(grad_seed)
    dg_roots, th_roots, dg_grads, th_grads = [], [], [], []
    for d, t in zip(dg_out, th_out):
        if isinstance(d, distgrad.Tensor) and d.requires_grad:
            g = rng.standard_normal(array_of(d).shape)
            if array_of(d).dtype.kind == "c":
                g = g + 1j * rng.standard_normal(array_of(d).shape)
            g = g.astype(array_of(d).dtype)
            dg_roots.append(d)
            th_roots.append(t)
            dg_grads.append(distgrad.tensor(g))
            th_grads.append(to_torch(g))
    if not dg_roots:
        return dg_out
    distgrad.autograd.backward(dg_roots, dg_grads)
    torch.autograd.backward(th_roots, th_grads)
    for i, (d, t) in enumerate(zip(dg_in, th_in)):
        if not t.requires_grad:
            continue
        tg = t.grad
        dgv = d.grad
        if tg is None:
            assert dgv is None or not np.any(array_of(dgv)), f"input {i}: torch has no grad"
            continue
        assert dgv is not None, f"input {i}: distgrad produced no gradient, torch did"
        assert array_of(dgv).dtype == from_torch(tg).dtype, f"input {i} grad dtype"
        np.testing.assert_allclose(array_of(dgv), from_torch(tg), atol=atol, rtol=rtol,
                                   equal_nan=True, err_msg=f"gradient of input {i}")
    return dg_out


def _finite_difference_check(fn, arrays, requires_grad, atol, rtol):
    """Without the oracle: gradcheck in double precision (finite differences in float32
    measure rounding, not derivatives). An op that computes in single precision inside
    (a cast to float32, say) is checked with a step and tolerance that precision allows."""
    def double(a):
        return a.astype(np.complex128 if a.dtype.kind == "c" else np.float64) \
            if a.dtype.kind in "fc" else a
    inputs = tuple(distgrad.tensor(double(a), requires_grad=rg)
                   for a, rg in zip(arrays, requires_grad))

    def floating_outputs(*xs):
        return tuple(o for o in _flat(fn(distgrad, *xs))
                     if o.dtype.is_floating_point or o.dtype.is_complex)
    single = any(o.dtype in (distgrad.float32, distgrad.complex64)
                 for o in floating_outputs(*inputs))
    if single:
        eps, atol, rtol = 1e-3, 1e-2, 1e-2
    else:
        eps, atol, rtol = 1e-6, atol * 10, rtol * 100
    assert distgrad.autograd.gradcheck(floating_outputs, inputs, eps=eps, atol=atol, rtol=rtol)

"""Finite-difference checks of gradients: ``gradcheck`` and ``gradgradcheck``.

Complex inputs and outputs follow PyTorch's convention: for a real loss
L = sum(Re(conj(u) * out)), the gradient of a complex input z = a + ib is
dL/da + i dL/db. The numerical Jacobian is built by perturbing real and
imaginary parts; the analytical one by one ``autograd.grad`` per output element.
"""
import warnings

import numpy as np

from .engine import as_tuple, grad as autograd_grad
from .grad_mode import enable_grad, no_grad
from .tensor import TensorBase, _make

__all__ = ["gradcheck", "gradgradcheck", "GradcheckError"]


class GradcheckError(RuntimeError):
    """Raised by gradcheck when analytical and numerical gradients disagree."""


def _differentiable_outputs(func, inputs):
    out = as_tuple(func(*inputs))
    return [o for o in out if isinstance(o, TensorBase) and o.requires_grad]


def _evaluate(func, inputs):
    with no_grad():
        return [o._data.copy() for o in as_tuple(func(*inputs)) if isinstance(o, TensorBase)
                and o._data.dtype.kind in "fc"]


def _numerical(func, inputs, x, eps):
    """d out / d x as columns per element of x: list over outputs of (n_x, n_out) complex arrays."""
    flat = x._data.reshape(-1)
    if not np.shares_memory(flat, x._data):
        raise GradcheckError("gradcheck needs contiguous inputs")
    cols_re, cols_im = [], []
    directions = [1.0] + ([1j] if x._data.dtype.kind == "c" else [])
    for j in range(flat.size):
        per_dir = []
        for d in directions:
            orig = flat[j]
            flat[j] = orig + eps * d
            plus = _evaluate(func, inputs)
            flat[j] = orig - eps * d
            minus = _evaluate(func, inputs)
            flat[j] = orig
            per_dir.append([(p - m).reshape(-1) / (2 * eps) for p, m in zip(plus, minus)])
        cols_re.append(per_dir[0])
        cols_im.append(per_dir[1] if len(per_dir) > 1 else None)
    return cols_re, cols_im


def gradcheck(func, inputs, *, eps=1e-6, atol=1e-5, rtol=1e-3, raise_exception=True,
              nondet_tol=0.0, check_undefined_grad=True, check_grad_dtypes=False,
              check_batched_grad=False, check_batched_forward_grad=False,
              check_forward_ad=False, check_backward_ad=True, fast_mode=False, masked=None):
    """Check analytical gradients of ``func`` against central finite differences.

    >>> import distgrad
    >>> x = distgrad.randn(3, dtype=distgrad.float64, requires_grad=True)
    >>> gradcheck(lambda t: (t * t).sum(), (x,))
    True
    """
    inputs = as_tuple(inputs)
    diff_inputs = [(i, x) for i, x in enumerate(inputs)
                   if isinstance(x, TensorBase) and x.requires_grad]
    for i, x in diff_inputs:
        if x._data.dtype not in (np.float64, np.complex128):
            warnings.warn(f"Input #{i} requires gradient and is not a double precision floating "
                          "point or complex. This check will likely fail if all the inputs are "
                          "not of double precision floating point or complex.", UserWarning)
    with enable_grad():
        outputs = _differentiable_outputs(func, inputs)
    for oi, out in enumerate(outputs):
        n_out = out._data.size
        out_complex = out._data.dtype.kind == "c"
        for ii, x in diff_inputs:
            cols_re, cols_im = _numerical(func, inputs, x, eps)
            x_complex = x._data.dtype.kind == "c"
            for k in range(n_out):
                for u in ([1.0, 1j] if out_complex else [1.0]):
                    # Numerical: L = Re(conj(u) * out_k); dL/da (+ i dL/db for complex x).
                    num = np.array([np.real(np.conj(u) * col[oi][k]) for col in cols_re])
                    if x_complex:
                        num = num + 1j * np.array([np.real(np.conj(u) * col[oi][k])
                                                   for col in cols_im])
                    g_out = np.zeros(out._data.shape, dtype=out._data.dtype)
                    g_out.reshape(-1)[k] = u
                    with enable_grad():
                        fresh = _differentiable_outputs(func, inputs)[oi]
                        (ana,) = autograd_grad(fresh, x, _make(g_out), allow_unused=True)
                    ana = np.zeros(x._data.size, dtype=x._data.dtype) if ana is None else \
                        ana._data.reshape(-1)
                    if not np.allclose(ana, num, rtol=rtol, atol=atol, equal_nan=True):
                        msg = (f"Jacobian mismatch for output {oi} with respect to input {ii},\n"
                               f"output element {k} (grad_output {u}),\n"
                               f"numerical:{num}\nanalytical:{ana}\n")
                        if raise_exception:
                            raise GradcheckError(msg)
                        return False
    return True


def gradgradcheck(func, inputs, grad_outputs=None, *, eps=1e-6, atol=1e-5, rtol=1e-3,
                  gen_non_contig_grad_outputs=False, raise_exception=True, nondet_tol=0.0,
                  check_undefined_grad=True, check_grad_dtypes=False, check_batched_grad=False,
                  check_fwd_over_rev=False, check_rev_over_rev=True, fast_mode=False, masked=False):
    """Check second-order gradients: gradcheck of the gradient with ``create_graph=True``."""
    inputs = as_tuple(inputs)
    with enable_grad():
        outputs = _differentiable_outputs(func, inputs)
    if grad_outputs is None:
        rng = np.random.default_rng(0)
        grad_outputs = []
        for o in outputs:
            g = rng.standard_normal(o._data.shape)
            if o._data.dtype.kind == "c":
                g = g + 1j * rng.standard_normal(o._data.shape)
            t = _make(g.astype(o._data.dtype))
            t.requires_grad_(True)
            grad_outputs.append(t)
    grad_outputs = as_tuple(grad_outputs)
    n_in = len(inputs)
    diff_positions = [i for i, x in enumerate(inputs)
                      if isinstance(x, TensorBase) and x.requires_grad]

    def first_order(*args):
        ins, gos = args[:n_in], args[n_in:]
        with enable_grad():  # gradcheck evaluates under no_grad; the first order needs a graph
            outs = _differentiable_outputs(func, ins)
            grads = autograd_grad(outs, [ins[i] for i in diff_positions], gos, create_graph=True,
                                  allow_unused=True)
        return tuple(g for g in grads if g is not None)

    return gradcheck(first_order, inputs + tuple(grad_outputs), eps=eps, atol=atol, rtol=rtol,
                     raise_exception=raise_exception)

"""Second order for every op of the op tests: grad of (grad)^2 against PyTorch.

Catches VJP rules that compute part of a gradient from raw arrays (constants under
create_graph) instead of through ``xp``.
"""
import os
import sys

import numpy as np
import pytest

import distgrad
from distgrad.testing.oracle import make_inputs, torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "ops"))
from test_ops_vs_torch import COMPLEX_CASES, REAL_CASES  # noqa: E402

pytestmark = pytest.mark.skipif(torch is None, reason="PyTorch (the oracle) is not installed")

# A composite of where(): its first gradient is piecewise constant and, as in any
# composite of where, does not stay attached to the graph (PyTorch's fused
# leaky_relu_backward does, with a zero derivative). Both give zero second order.
DETACHED_FIRST_ORDER = {"leaky_relu"}


def _second_order(m, fn, arrays):
    ins = [m.tensor(a, requires_grad=a.dtype.kind in "fc") for a in arrays]
    outs = fn(m, *ins)
    outs = list(outs) if isinstance(outs, (tuple, list)) else [outs]
    total = sum((o.abs() if o.is_complex() else o).sum() * (i + 1)
                for i, o in enumerate(outs) if o.requires_grad)
    diff = [t for t in ins if t.requires_grad]
    grads = m.autograd.grad(total, diff, create_graph=True, allow_unused=True)
    terms = [((g * g.conj()).real if g.is_complex() else g * g).sum()
             for g in grads if g is not None and g.requires_grad]
    if not terms:
        return None
    second = m.autograd.grad(sum(terms), diff, allow_unused=True)
    return [None if g is None else g.detach().numpy().copy() for g in second]


CASES = [(name, fn, shapes, np.float64) for name, fn, shapes in REAL_CASES
         if name not in DETACHED_FIRST_ORDER and name != "abs"] + \
        [("complex_" + name, fn, shapes, np.complex128) for name, fn, shapes in COMPLEX_CASES]


@pytest.mark.parametrize("name,fn,shapes,dtype", CASES, ids=[c[0] for c in CASES])
def test_second_order_matches_torch(name, fn, shapes, dtype):
    arrays = make_inputs(shapes, dtype, seed=0, low=-2.0 if "prod" in name else 0.2, high=2.0)
    ours = _second_order(distgrad, fn, arrays)
    theirs = _second_order(torch, fn, arrays)
    assert (ours is None) == (theirs is None)
    if ours is None:
        return
    for a, b in zip(ours, theirs):
        if a is None or b is None:
            assert np.allclose(a if a is not None else 0, b if b is not None else 0)
        else:
            np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-8)

"""Run one layer in distgrad and in PyTorch with the same parameters; compare what comes out.

Used by the conv/pool and recurrent layer tests (PyTorch must be installed).
"""
import numpy as np

import distgrad
from distgrad import nn
from distgrad.testing.oracle import torch

TOL = {np.float32: dict(rtol=1e-4, atol=1e-5), np.float64: dict(rtol=1e-7, atol=1e-9)}


def module_pair(build, dtype, seed=0):
    """``build(torch.nn)`` carrying the parameters and buffers of ``build(distgrad.nn)``."""
    distgrad.manual_seed(seed)
    ours, theirs = build(nn), build(torch.nn)
    if dtype == np.float64:
        ours.double()
        theirs.double()
    theirs.load_state_dict({k: torch.from_numpy(v.numpy().copy())
                            for k, v in ours.state_dict().items()})
    return ours, theirs


def _flat(value):
    if isinstance(value, (tuple, list)):
        return [t for v in value for t in _flat(v)]
    return [value]


def run_both(build, shapes, dtype, seed=0, group=lambda inputs: inputs):
    """Forward random inputs of ``shapes`` (``group`` arranges them as arguments), then
    backward random gradients of every differentiable output.

    Returns (ours, theirs) pairs: every output, every input's gradient, every
    parameter's gradient.
    """
    ours, theirs = module_pair(build, dtype, seed)
    rng = np.random.default_rng(seed)
    arrays = [rng.standard_normal(s).astype(dtype) for s in shapes]
    xs = [distgrad.tensor(a, requires_grad=True) for a in arrays]
    txs = [torch.tensor(a, requires_grad=True) for a in arrays]
    outs, touts = _flat(ours(*group(xs))), _flat(theirs(*group(txs)))
    roots = [i for i, t in enumerate(touts) if t.requires_grad]
    grads = [rng.standard_normal(tuple(touts[i].shape)).astype(dtype) for i in roots]
    distgrad.autograd.backward([outs[i] for i in roots], [distgrad.tensor(g) for g in grads])
    torch.autograd.backward([touts[i] for i in roots], [torch.tensor(g) for g in grads])
    pairs = list(zip(outs, touts)) + [(x.grad, tx.grad) for x, tx in zip(xs, txs)]
    pairs += [(p.grad, tp.grad) for p, tp in zip(ours.parameters(), theirs.parameters())]
    return pairs


def assert_pairs_close(pairs, dtype):
    for i, (a, b) in enumerate(pairs):
        assert a is not None and b is not None, f"pair {i}: one side has no tensor"
        assert tuple(a.shape) == tuple(b.shape), f"pair {i}: {tuple(a.shape)} vs {tuple(b.shape)}"
        if b.dtype == torch.int64:  # indices: exactly
            np.testing.assert_array_equal(a.numpy(), b.numpy(), err_msg=f"pair {i}")
        else:
            np.testing.assert_allclose(a.detach().numpy(), b.detach().numpy(),
                                       err_msg=f"pair {i}", **TOL[dtype])

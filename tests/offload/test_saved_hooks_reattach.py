"""The autograd core change offloading needs: a tensor returned by an unpack hook is
reattached where the saved tensor sat in the graph (PyTorch's SavedVariable::unpack),
so hooks that return a copy keep double backward exact."""
import pytest

import distgrad

pytestmark = pytest.mark.timeout(30)


def _second_derivatives(lib):
    x = lib.tensor([0.5, -1.25, 2.0], dtype=lib.float64, requires_grad=True)
    with lib.autograd.graph.saved_tensors_hooks(lambda t: t.detach().clone(), lambda t: t):
        y = (x.exp() * x.sin()).sum()   # mul saves two non-leaf inputs; exp saves its result
        z = (x * x * x).sum()           # mul saves the leaf x
    out = []
    for f in (y, z):
        (g,) = lib.autograd.grad(f, x, create_graph=True)
        (gg,) = lib.autograd.grad(g.sum(), x)
        out.extend(gg.tolist())
    return out


def test_copies_from_unpack_hooks_keep_second_order_exact():
    got = _second_derivatives(distgrad)
    torch = pytest.importorskip("torch")
    assert got == pytest.approx(_second_derivatives(torch), rel=1e-12)

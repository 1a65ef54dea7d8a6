"""Small drop-in behaviours of the graph that programs can observe, each compared with
PyTorch (the recorded expectations keep every check meaningful where torch is absent)."""
import gc

import pytest

import distgrad
from distgrad.testing.oracle import torch

pytestmark = pytest.mark.timeout(60)


def _node_name(t):
    return type(t.grad_fn).__name__ if t.grad_fn is not None else None


def _edges(t):
    if t.grad_fn is None:
        return []
    return [type(n).__name__ if n is not None else None for n, _ in t.grad_fn.next_functions]


def scalar_op_nodes(lib):
    """The node (and its edges) of every op with a Python number or a rounding mode, and
    what backward through it gives: zeros or an error where PyTorch has no derivative."""
    v = lib.ones(2, requires_grad=True)
    cases = {
        "t*s": lambda: v * 2, "s*t": lambda: 2 * v, "t*bool": lambda: v * True,
        "t+s": lambda: v + 2, "s+t": lambda: 2 + v, "t-s": lambda: v - 2, "s-t": lambda: 2 - v,
        "t/s": lambda: v / 2, "s/t": lambda: 2 / v, "t**s": lambda: v ** 2,
        "t**2.5": lambda: v ** 2.5, "t**0": lambda: v ** 0, "s**t": lambda: 2 ** v,
        "t**t0d": lambda: v ** lib.tensor(2.0), "sub_alpha": lambda: v.sub(2, alpha=3),
        "add_alpha": lambda: v.add(v, alpha=3), "square": lambda: v.square(),
        "t%s": lambda: v % 2, "t%t": lambda: v.remainder(v), "s%t": lambda: 2 % v,
        "fmod_s": lambda: v.fmod(2), "fmod_t": lambda: v.fmod(v),
        "t//s": lambda: v // 2, "t//t": lambda: v // v, "s//t": lambda: 2 // v,
        "div_floor": lambda: v.div(2, rounding_mode="floor"),
        "div_trunc": lambda: v.div(v, rounding_mode="trunc"),
        "inplace_mul": lambda: v.clone().mul_(2), "inplace_add": lambda: v.clone().add_(2),
    }
    out = []
    for name, make in cases.items():
        r = make()
        try:
            r.sum().backward()
            result = [round(g, 4) for g in v.grad.tolist()]
        except RuntimeError as e:
            result = str(e)
        v.grad = None
        out.append((name, _node_name(r), _edges(r), result))
    return out


def pack_order(lib):
    """With two or more saved tensors, pack hooks see them in PyTorch's order."""
    a = lib.ones(2, 2, requires_grad=True)
    b = lib.full((2, 2), 2.0, requires_grad=True)
    c = lib.full((2, 2), 3.0, requires_grad=True)
    ops = {"mul": lambda: a * b, "div": lambda: a / b, "pow": lambda: a.pow(b),
           "maximum": lambda: lib.maximum(a, b), "minimum": lambda: lib.minimum(a, b),
           "mm": lambda: a @ b, "bmm": lambda: lib.bmm(a[None], b[None]),
           "dot": lambda: lib.dot(a[0], b[0]), "mv": lambda: lib.mv(a, b[0]),
           "clamp": lambda: lib.clamp(a, b, c), "conv": lambda: lib.nn.functional.conv1d(
               a[None], b[:, :, None])}
    out = []
    for name, make in ops.items():
        log = []

        def pack(t):
            log.append(float(t.detach().reshape(-1)[0]))
            return t
        with lib.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            make()
        out.append((name, log))
    return out


def saved_attribute_listing(lib):
    """``dir(grad_fn)`` lists the ``_saved_*``/``_raw_saved_*`` attributes that resolve."""
    x = lib.ones(2, requires_grad=True)
    w = lib.full((2,), 2.0, requires_grad=True)
    out = []
    for node in ((x * w).grad_fn, x.exp().grad_fn, x.pow(3).grad_fn):
        listed = [a for a in dir(node) if a.startswith(("_saved_", "_raw_saved_"))]
        out.append(all(hasattr(node, a) for a in listed))
        out.append(sorted(a for a in listed if a.startswith("_raw_saved_")))
    return out


def accumulate_grad_holds_leaf(lib):
    node = lib.tensor(1.0, requires_grad=True).clone().grad_fn
    gc.collect()
    acc = node.next_functions[0][0]
    leaf = acc.variable
    return [type(acc).__name__, leaf is not None and leaf.requires_grad,
            leaf is not None and leaf.item() == 1.0]


def function_on_inference_tensor(lib):
    """A custom Function saves nothing when grad is off (PyTorch's is_executable)."""
    class Twice(lib.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            ctx.save_for_backward(x)
            return x * 2

        @staticmethod
        def backward(ctx, g):
            (x,) = ctx.saved_tensors
            return g * x

    with lib.inference_mode():
        t = lib.ones(2)
    with lib.no_grad():
        a = Twice.apply(t)
    b = Twice.apply(t)  # no input requires grad: not executable either
    return [a.tolist(), b.tolist(), a.requires_grad, b.requires_grad]


def grad_shares_caller_gradient(lib):
    """A view's backward hands the leaf a view of the caller's ``gradient=``, which PyTorch
    keeps as ``.grad`` without a copy: a later change to either shows in the other. A
    gradient that reaches the leaf as the caller's own tensor, or not contiguous, is copied."""
    out = []
    views = {"reshape": lambda x: x.reshape(-1), "view": lambda x: x.view(6),
             "unsqueeze": lambda x: x.unsqueeze(0), "flatten": lambda x: x.flatten()}
    for name, view in views.items():
        x = lib.ones(2, 3, requires_grad=True)
        y = view(x)
        g = lib.ones(y.shape)
        y.backward(g, retain_graph=True)
        g.mul_(7)
        first = x.grad[0, 0].item()
        y.backward(g)  # accumulates into .grad in place: the caller's gradient changes too
        out.append((name, first, x.grad[0, 0].item(), g.reshape(-1)[0].item()))
    x1, x2 = lib.ones(2, 3, requires_grad=True), lib.ones(2, 3, requires_grad=True)
    g = lib.ones(6)
    (x1.reshape(-1) + x2.reshape(-1)).backward(g)
    x1.grad.mul_(3)
    out.append(("two leaves", x2.grad[0, 0].item(), g[0].item()))
    for name, g in (("leaf itself", lib.ones(6)), ("not contiguous", lib.ones(12)[::2]),
                    ("part of a bigger buffer", lib.ones(12)[:6])):
        x = lib.ones(6, requires_grad=True)
        (x if name == "leaf itself" else x.view(6)).backward(g)
        g.mul_(5)
        out.append((name, x.grad[0].item()))
    return out


SCENARIOS = [scalar_op_nodes, pack_order, saved_attribute_listing, accumulate_grad_holds_leaf,
             function_on_inference_tensor, grad_shares_caller_gradient]

# Recorded from torch 2.13 (CPU).
EXPECTED = {
    "scalar_op_nodes": [
        ("t*s", "MulBackward0", ["AccumulateGrad", None], [2.0, 2.0]),
        ("s*t", "MulBackward0", ["AccumulateGrad", None], [2.0, 2.0]),
        ("t*bool", "MulBackward0", ["AccumulateGrad", None], [1.0, 1.0]),
        ("t+s", "AddBackward0", ["AccumulateGrad", None], [1.0, 1.0]),
        ("s+t", "AddBackward0", ["AccumulateGrad", None], [1.0, 1.0]),
        ("t-s", "SubBackward0", ["AccumulateGrad", None], [1.0, 1.0]),
        ("s-t", "RsubBackward1", ["AccumulateGrad"], [-1.0, -1.0]),
        ("t/s", "DivBackward0", ["AccumulateGrad", None], [0.5, 0.5]),
        ("s/t", "MulBackward0", ["ReciprocalBackward0", None], [-2.0, -2.0]),
        ("t**s", "PowBackward0", ["AccumulateGrad"], [2.0, 2.0]),
        ("t**2.5", "PowBackward0", ["AccumulateGrad"], [2.5, 2.5]),
        ("t**0", "PowBackward0", ["AccumulateGrad"], [0.0, 0.0]),
        ("s**t", "PowBackward2", ["AccumulateGrad"], [1.3863, 1.3863]),
        ("t**t0d", "PowBackward1", ["AccumulateGrad", None], [2.0, 2.0]),
        ("sub_alpha", "SubBackward0", ["AccumulateGrad", None], [1.0, 1.0]),
        ("add_alpha", "AddBackward0", ["AccumulateGrad", "AccumulateGrad"], [4.0, 4.0]),
        ("square", "PowBackward0", ["AccumulateGrad"], [2.0, 2.0]),
        ("t%s", "RemainderBackward0", ["AccumulateGrad"], [1.0, 1.0]),
        ("t%t", "RemainderBackward1", ["AccumulateGrad", "AccumulateGrad"], [0.0, 0.0]),
        ("s%t", "NotImplemented", ["AccumulateGrad"],
         "derivative for aten::remainder is not implemented"),
        ("fmod_s", "FmodBackward0", ["AccumulateGrad"], [1.0, 1.0]),
        ("fmod_t", "FmodBackward1", ["AccumulateGrad", "AccumulateGrad"], [0.0, 0.0]),
        ("t//s", "NotImplemented", ["AccumulateGrad"],
         "derivative for aten::floor_divide is not implemented"),
        ("t//t", "NotImplemented", ["AccumulateGrad", "AccumulateGrad"],
         "derivative for aten::floor_divide is not implemented"),
        ("s//t", "NotImplemented", ["AccumulateGrad"],
         "derivative for aten::floor_divide is not implemented"),
        ("div_floor", "DivBackward2", ["AccumulateGrad", None], [0.0, 0.0]),
        ("div_trunc", "DivBackward2", ["AccumulateGrad", "AccumulateGrad"], [0.0, 0.0]),
        ("inplace_mul", "MulBackward0", ["CloneBackward0", None], [2.0, 2.0]),
        ("inplace_add", "AddBackward0", ["CloneBackward0", None], [1.0, 1.0]),
    ],
    "pack_order": [("mul", [2.0, 1.0]), ("div", [2.0, 1.0]), ("pow", [2.0, 1.0, 1.0]),
                   ("maximum", [2.0, 1.0]), ("minimum", [2.0, 1.0]), ("mm", [2.0, 1.0]),
                   ("bmm", [2.0, 1.0]), ("dot", [1.0, 2.0]), ("mv", [1.0, 2.0]),
                   ("clamp", [3.0, 2.0, 1.0]), ("conv", [1.0, 2.0])],
    "saved_attribute_listing": [True, ["_raw_saved_other", "_raw_saved_self"],
                                True, ["_raw_saved_result"], True, ["_raw_saved_self"]],
    "accumulate_grad_holds_leaf": ["AccumulateGrad", True, True],
    "function_on_inference_tensor": [[2.0, 2.0], [2.0, 2.0], False, False],
    "grad_shares_caller_gradient": [
        ("reshape", 7.0, 14.0, 14.0), ("view", 7.0, 14.0, 14.0),
        ("unsqueeze", 7.0, 14.0, 14.0), ("flatten", 7.0, 14.0, 14.0),
        ("two leaves", 3.0, 3.0), ("leaf itself", 1.0), ("not contiguous", 1.0),
        ("part of a bigger buffer", 5.0)],
}


@pytest.mark.parametrize("scenario", SCENARIOS, ids=lambda f: f.__name__)
def test_matches_pytorch(scenario):
    log = scenario(distgrad)
    assert log == EXPECTED[scenario.__name__]
    assert torch is None or log == scenario(torch)


def test_saved_attribute_listing_names_saved_inputs():
    x = distgrad.ones(2, requires_grad=True)
    listed = [a for a in dir((x * x).grad_fn) if a.startswith("_saved_")]
    assert {"_saved_self", "_saved_other"} <= set(listed)

"""Custom ``torch.autograd.Function``s that support double backward, and one that does not.

Four ways a Function's backward can be written, each put through
``torch.autograd.gradcheck`` and ``gradgradcheck`` the way PyTorch's double-backward
tutorial does it:

* ``Sine`` saves its input with ``save_for_backward``; its backward is made of
  differentiable ops, so autograd can differentiate it again;
* ``Logistic`` saves its *output* instead;
* ``Softplus`` needs an intermediate (``exp(x)``) in backward: it returns it as an
  extra output so that the intermediate is part of the graph, and its backward takes a
  gradient for every output;
* ``SoftplusOnCtx`` keeps that intermediate on ``ctx`` instead: the first derivative is
  right, but the gradient it returns is not connected to the graph;
* ``Power`` (x ** n, n a plain int kept on ``ctx``) has a backward that is a Function of
  its own, ``PowerGrad``, with a hand-written backward, for when the first backward
  cannot be recorded.

The graph that ``grad(..., create_graph=True)`` builds is walked through
``next_functions`` and ``AccumulateGrad.variable``, the way graph drawing tools read it.
Inputs come from a seeded NumPy generator. Plain PyTorch.
"""
import json

import numpy as np
import torch

rng = np.random.default_rng(21)
report = {}


def leaf(*shape):
    """A float64 leaf (finite differences need the precision) that requires grad."""
    return torch.from_numpy(rng.uniform(-1.0, 1.0, shape)).requires_grad_()


def graph_of(*tensors):
    """Sorted node class names reachable from the tensors, and the leaves' shapes."""
    kinds, leaf_shapes, visited = [], [], set()
    pending = [t.grad_fn for t in tensors if t.grad_fn is not None]
    while pending:
        node = pending.pop()
        if node is None or node in visited:
            continue
        visited.add(node)
        kinds.append(type(node).__name__)
        if hasattr(node, "variable"):
            leaf_shapes.append(list(node.variable.shape))
        pending.extend(child for child, _ in node.next_functions)
    return sorted(kinds), leaf_shapes


def both_checks(fn, *inputs):
    return [torch.autograd.gradcheck(fn, inputs), torch.autograd.gradgradcheck(fn, inputs)]


def first_and_second(fn, x):
    """d fn/dx with a graph, then the derivative of its sum."""
    y = fn(x)
    (dy,) = torch.autograd.grad(y.sum(), x, create_graph=True)
    (d2y,) = torch.autograd.grad(dy.sum(), x)
    return y, dy, d2y


class Sine(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return torch.sin(x)

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        return grad * torch.cos(x)  # recorded by autograd when create_graph=True


x = leaf(2, 3)
report["sine_checks"] = both_checks(Sine.apply, x)
y, dy, d2y = first_and_second(Sine.apply, x)
report["sine"] = [dy.sum().item(), d2y.sum().item(), dy.requires_grad, graph_of(dy, y)[1]]


class Logistic(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        out = 1 / (1 + torch.exp(-x))
        ctx.save_for_backward(out)  # an output saved: save_for_backward, not ctx.attr
        return out

    @staticmethod
    def backward(ctx, grad):
        (out,) = ctx.saved_tensors
        return grad * out * (1 - out)


x = leaf(4)
report["logistic_checks"] = both_checks(Logistic.apply, x)
y, dy, d2y = first_and_second(Logistic.apply, x)
report["logistic"] = [dy.tolist(), d2y.tolist(), graph_of(dy, y)[1]]


class Softplus(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        e = torch.exp(x)
        ctx.save_for_backward(e)
        # e leaves as an output too, which puts it in the graph for double backward
        return torch.log(1 + e), e

    @staticmethod
    def backward(ctx, grad, grad_e):
        (e,) = ctx.saved_tensors
        return grad * e / (1 + e) + grad_e * e


def softplus(x):
    return Softplus.apply(x)[0]


x = leaf(3, 2)
report["softplus_checks"] = both_checks(softplus, x)
y, dy, d2y = first_and_second(softplus, x)
report["softplus"] = [dy.sum().item(), d2y.sum().item(), graph_of(dy, y)[1]]


class SoftplusOnCtx(torch.autograd.Function):
    """The mistake: an intermediate kept on ctx is a constant to autograd."""

    @staticmethod
    def forward(ctx, x):
        ctx.e = torch.exp(x)
        return torch.log(1 + ctx.e)

    @staticmethod
    def backward(ctx, grad):
        return grad * ctx.e / (1 + ctx.e)


(dy,) = torch.autograd.grad(SoftplusOnCtx.apply(x).sum(), x, create_graph=True)
report["softplus_on_ctx"] = [dy.requires_grad, dy.grad_fn is None, dy.sum().item()]


class Power(torch.autograd.Function):
    """x ** n for a whole number n, a non-tensor argument (its gradient is None)."""

    @staticmethod
    def forward(ctx, x, n):
        ctx.n = n  # not a tensor: kept on ctx
        ctx.save_for_backward(x)
        return x ** n

    @staticmethod
    def backward(ctx, grad):
        return PowerGrad.apply(grad, *ctx.saved_tensors, ctx.n), None


class PowerGrad(torch.autograd.Function):
    """(g, x) -> g n x^(n-1) as one opaque step, with its own derivatives in g and x."""

    @staticmethod
    def forward(ctx, grad, x, n):
        ctx.n = n
        ctx.save_for_backward(grad, x)
        return grad * n * x ** (n - 1)

    @staticmethod
    def backward(ctx, upstream):
        grad, x = ctx.saved_tensors
        n = ctx.n
        return upstream * n * x ** (n - 1), upstream * grad * n * (n - 1) * x ** (n - 2), None


def fourth_power(x):
    return Power.apply(x, 4)


x = torch.tensor(1.5, dtype=torch.double, requires_grad=True)
report["power_checks"] = both_checks(fourth_power, x)
y, dy, d2y = first_and_second(fourth_power, x)
kinds, shapes = graph_of(dy, y)
report["power"] = [dy.item(), d2y.item(), kinds, shapes]
print("RESULT " + json.dumps(report))

"""Double backward with custom autograd Functions: the PyTorch tutorial's five Functions.

Port of pytorch/tutorials `intermediate_source/custom_function_double_backward_tutorial.rst`:
`Square` (saves an input), `Exp` (saves an output), `Sinh` (returns its intermediate
results so they can be saved), `SinhBad` (what not to do) and `Cube` with its
`CubeBackward` (a backward that autograd cannot track, given its own backward), each
checked with `gradcheck` and `gradgradcheck` as in the tutorial. Where the tutorial draws
the graph with torchviz, this port walks it the way `torchviz.make_dot` does (each
node's `next_functions`, an `AccumulateGrad` node's `variable`) and records what it
finds. Inputs come from a seeded NumPy generator instead of `torch.rand`. Plain PyTorch.
"""
import json

import numpy as np
import torch

rng = np.random.default_rng(0)
result = {}


def rand(*shape):
    return torch.from_numpy(rng.random(shape)).requires_grad_(True)  # float64, as torch.double


def walk(*roots):
    """What torchviz.make_dot visits: node names, and the leaves AccumulateGrad holds."""
    names, leaves, seen = [], [], set()
    stack = [r.grad_fn for r in roots if r.grad_fn is not None]
    while stack:
        fn = stack.pop()
        if fn is None or fn in seen:
            continue
        seen.add(fn)
        names.append(type(fn).__name__)
        if hasattr(fn, "variable"):
            leaves.append(list(fn.variable.shape))
        for next_fn, _ in fn.next_functions:
            stack.append(next_fn)
    return sorted(names), leaves


class Square(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        # Because we are saving one of the inputs use `save_for_backward`
        # Save non-tensors and non-inputs/non-outputs directly on ctx
        ctx.save_for_backward(x)
        return x**2

    @staticmethod
    def backward(ctx, grad_out):
        # A function support double backward automatically if autograd
        # is able to record the computations performed in backward
        x, = ctx.saved_tensors
        return grad_out * 2 * x


# Use double precision because finite differencing method magnifies errors
x = rand(3, 3)
result["square"] = [torch.autograd.gradcheck(Square.apply, x),
                    # Use gradcheck to verify second-order derivatives
                    torch.autograd.gradgradcheck(Square.apply, x)]

x = torch.tensor(1., requires_grad=True).clone()
out = Square.apply(x)
grad_x, = torch.autograd.grad(out, x, create_graph=True)
result["square_graph"] = [grad_x.item(), grad_x.requires_grad, walk(grad_x, out)[1]]


class Exp(torch.autograd.Function):
    # Simple case where everything goes well
    @staticmethod
    def forward(ctx, x):
        # This time we save the output
        result = torch.exp(x)
        # Note that we should use `save_for_backward` here when
        # the tensor saved is an ouptut (or an input).
        ctx.save_for_backward(result)
        return result

    @staticmethod
    def backward(ctx, grad_out):
        result, = ctx.saved_tensors
        return result * grad_out


x = torch.tensor(1., requires_grad=True, dtype=torch.double).clone()
# Validate our gradients using gradcheck
result["exp"] = [torch.autograd.gradcheck(Exp.apply, x),
                 torch.autograd.gradgradcheck(Exp.apply, x)]
out = Exp.apply(x)
grad_x, = torch.autograd.grad(out, x, create_graph=True)
(grad_grad_x,) = torch.autograd.grad(grad_x, x)
result["exp_graph"] = [grad_x.item(), grad_grad_x.item(), walk(grad_x, out)[1]]


class Sinh(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        expx = torch.exp(x)
        expnegx = torch.exp(-x)
        ctx.save_for_backward(expx, expnegx)
        # In order to be able to save the intermediate results, a trick is to
        # include them as our outputs, so that the backward graph is constructed
        return (expx - expnegx) / 2, expx, expnegx

    @staticmethod
    def backward(ctx, grad_out, _grad_out_exp, _grad_out_negexp):
        expx, expnegx = ctx.saved_tensors
        grad_input = grad_out * (expx + expnegx) / 2
        # We cannot skip accumulating these even though we won't use the outputs
        # directly. They will be used later in the second backward.
        grad_input += _grad_out_exp * expx
        grad_input -= _grad_out_negexp * expnegx
        return grad_input


def sinh(x):
    # Create a wrapper that only returns the first output
    return Sinh.apply(x)[0]


x = rand(3, 3)
result["sinh"] = [torch.autograd.gradcheck(sinh, x), torch.autograd.gradgradcheck(sinh, x)]
out = sinh(x)
grad_x, = torch.autograd.grad(out.sum(), x, create_graph=True)
(grad_grad_x,) = torch.autograd.grad(grad_x.sum(), x)
result["sinh_graph"] = [grad_x.sum().item(), grad_grad_x.sum().item(), walk(grad_x, out)[1]]


class SinhBad(torch.autograd.Function):
    # This is an example of what NOT to do!
    @staticmethod
    def forward(ctx, x):
        expx = torch.exp(x)
        expnegx = torch.exp(-x)
        ctx.expx = expx
        ctx.expnegx = expnegx
        return (expx - expnegx) / 2

    @staticmethod
    def backward(ctx, grad_out):
        expx = ctx.expx
        expnegx = ctx.expnegx
        grad_input = grad_out * (expx + expnegx) / 2
        return grad_input


out = SinhBad.apply(x)
grad_x, = torch.autograd.grad(out.sum(), x, create_graph=True)
# "Notice that grad_x is not part of the graph!"
result["sinh_bad"] = [grad_x.requires_grad, grad_x.grad_fn is None, grad_x.sum().item()]


def cube_forward(x):
    return x**3


def cube_backward(grad_out, x):
    return grad_out * 3 * x**2


def cube_backward_backward(grad_out, sav_grad_out, x):
    return grad_out * sav_grad_out * 6 * x


def cube_backward_backward_grad_out(grad_out, x):
    return grad_out * 3 * x**2


class Cube(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return cube_forward(x)

    @staticmethod
    def backward(ctx, grad_out):
        x, = ctx.saved_tensors
        return CubeBackward.apply(grad_out, x)


class CubeBackward(torch.autograd.Function):
    @staticmethod
    def forward(ctx, grad_out, x):
        ctx.save_for_backward(x, grad_out)
        return cube_backward(grad_out, x)

    @staticmethod
    def backward(ctx, grad_out):
        x, sav_grad_out = ctx.saved_tensors
        dx = cube_backward_backward(grad_out, sav_grad_out, x)
        dgrad_out = cube_backward_backward_grad_out(grad_out, x)
        return dgrad_out, dx


x = torch.tensor(2., requires_grad=True, dtype=torch.double)

result["cube"] = [torch.autograd.gradcheck(Cube.apply, x),
                  torch.autograd.gradgradcheck(Cube.apply, x)]
out = Cube.apply(x)
grad_x, = torch.autograd.grad(out, x, create_graph=True)
(grad_grad_x,) = torch.autograd.grad(grad_x, x)
names, leaves = walk(grad_x, out)
result["cube_graph"] = [grad_x.item(), grad_grad_x.item(), names, leaves]
print("RESULT " + json.dumps(result))

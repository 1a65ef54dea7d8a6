"""Fit sin(x) with a cubic, three ways: the "Learning PyTorch with Examples" tutorial.

Ports of three steps of the tutorial, shrunk (fewer points and steps):
"Defining new autograd functions" (a Legendre polynomial P3 as a custom
``torch.autograd.Function``, updated by hand), "nn" + "optim" (``nn.Sequential``
of ``Linear`` and ``Flatten``, RMSprop) and "Control flow + weight sharing" (a
network whose depth Python's seeded ``random`` draws every pass). Parameters
start from fixed values instead of ``torch.randn``, whose stream is the
library's own. Plain PyTorch.
"""
import json
import math
import random

import torch


class LegendrePolynomial3(torch.autograd.Function):
    """P3(x) = (5x^3 - 3x) / 2, with its derivative written by hand."""

    @staticmethod
    def forward(ctx, input):
        ctx.save_for_backward(input)
        return 0.5 * (5 * input ** 3 - 3 * input)

    @staticmethod
    def backward(ctx, grad_output):
        (input,) = ctx.saved_tensors
        return grad_output * 1.5 * (5 * input ** 2 - 1)


def fit_with_custom_function():
    dtype = torch.float
    device = torch.device("cpu")
    x = torch.linspace(-math.pi, math.pi, 500, device=device, dtype=dtype)
    y = torch.sin(x)

    # starting values chosen so that the fit converges (as in the tutorial)
    a = torch.full((), 0.0, device=device, dtype=dtype, requires_grad=True)
    b = torch.full((), -1.0, device=device, dtype=dtype, requires_grad=True)
    c = torch.full((), 0.0, device=device, dtype=dtype, requires_grad=True)
    d = torch.full((), 0.3, device=device, dtype=dtype, requires_grad=True)

    check = torch.randn(6, dtype=torch.double, requires_grad=True)
    assert torch.autograd.gradcheck(LegendrePolynomial3.apply, (check,))

    learning_rate = 2e-5
    losses = []
    for t in range(400):
        P3 = LegendrePolynomial3.apply
        y_pred = a + b * P3(c + d * x)
        loss = (y_pred - y).pow(2).sum()
        if t % 50 == 49:
            print(t, loss.item())
            losses.append(loss.item())
        loss.backward()
        with torch.no_grad():
            a -= learning_rate * a.grad
            b -= learning_rate * b.grad
            c -= learning_rate * c.grad
            d -= learning_rate * d.grad
            a.grad = None
            b.grad = None
            c.grad = None
            d.grad = None

    print(f"Result: y = {a.item()} + {b.item()} * P3({c.item()} + {d.item()} x)")
    return {"losses": losses, "coefficients": [a.item(), b.item(), c.item(), d.item()]}


def fit_with_nn_and_optim():
    x = torch.linspace(-math.pi, math.pi, 500)
    y = torch.sin(x)

    # features (x, x^2, x^3): x is (500,), p is (3,), broadcasting gives (500, 3)
    p = torch.tensor([1, 2, 3])
    xx = x.unsqueeze(-1).pow(p)

    model = torch.nn.Sequential(
        torch.nn.Linear(3, 1),
        torch.nn.Flatten(0, 1),
    )
    with torch.no_grad():
        model[0].weight.copy_(torch.tensor([[0.3, -0.2, 0.1]]))
        model[0].bias.fill_(0.05)
    loss_fn = torch.nn.MSELoss(reduction="sum")

    learning_rate = 1e-3
    optimizer = torch.optim.RMSprop(model.parameters(), lr=learning_rate)
    losses = []
    for t in range(300):
        y_pred = model(xx)
        loss = loss_fn(y_pred, y)
        if t % 50 == 49:
            print(t, loss.item())
            losses.append(loss.item())
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()

    linear_layer = model[0]
    print(f"Result: y = {linear_layer.bias.item()} + {linear_layer.weight[:, 0].item()} x + "
          f"{linear_layer.weight[:, 1].item()} x^2 + {linear_layer.weight[:, 2].item()} x^3")
    return {"losses": losses, "weight": linear_layer.weight.detach().flatten().tolist(),
            "bias": linear_layer.bias.item()}


class DynamicNet(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a = torch.nn.Parameter(torch.tensor(0.1))
        self.b = torch.nn.Parameter(torch.tensor(0.9))
        self.c = torch.nn.Parameter(torch.tensor(-0.2))
        self.d = torch.nn.Parameter(torch.tensor(-0.1))
        self.e = torch.nn.Parameter(torch.tensor(0.01))

    def forward(self, x):
        """A 3rd, 4th or 5th order polynomial; the 4th and 5th order terms share `e`."""
        y = self.a + self.b * x + self.c * x ** 2 + self.d * x ** 3
        for exp in range(4, random.randint(4, 6)):
            y = y + self.e * x ** exp
        return y

    def string(self):
        return (f"y = {self.a.item()} + {self.b.item()} x + {self.c.item()} x^2 + "
                f"{self.d.item()} x^3 + {self.e.item()} x^4 ? + {self.e.item()} x^5 ?")


def fit_dynamic_net():
    random.seed(0)
    x = torch.linspace(-math.pi, math.pi, 500)
    y = torch.sin(x)

    model = DynamicNet()
    criterion = torch.nn.MSELoss(reduction="sum")
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-8, momentum=0.9)
    losses = []
    for t in range(300):
        y_pred = model(x)
        loss = criterion(y_pred, y)
        if t % 50 == 49:
            print(t, loss.item())
            losses.append(loss.item())
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()

    print(f"Result: {model.string()}")
    return {"losses": losses, "parameters": [p.item() for p in model.parameters()]}


def main():
    result = {"custom_function": fit_with_custom_function(),
              "nn_optim": fit_with_nn_and_optim(),
              "dynamic_net": fit_dynamic_net()}
    print("RESULT", json.dumps(result))


if __name__ == "__main__":
    main()

"""Gradient-flow analysis: the global full backward hook records every layer's gradient norms.

A deep tanh stack with a small initialisation shows vanishing gradients: the norm of
``grad_input`` shrinks layer by layer towards the input.

    python scripts/example_gradient_flow.py
"""
import distgrad as torch
import distgrad.nn as nn
from distgrad.nn.modules.module import register_module_full_backward_hook


def gradient_flow(model, x, y):
    names = {m: name for name, m in model.named_modules()}
    flow = []

    def hook(module, grad_input, grad_output):
        if isinstance(module, nn.Linear):
            gin = grad_input[0].norm().item() if grad_input[0] is not None else float("nan")
            flow.append((names[module], gin, grad_output[0].norm().item()))

    handle = register_module_full_backward_hook(hook)
    try:
        loss = nn.MSELoss()(model(x), y)
        loss.backward()
    finally:
        handle.remove()
    return loss.item(), flow


if __name__ == "__main__":
    torch.manual_seed(0)
    layers = []
    for _ in range(8):
        lin = nn.Linear(32, 32)
        nn.init.normal_(lin.weight, std=0.08)
        layers += [lin, nn.Tanh()]
    model = nn.Sequential(*layers)
    x = torch.randn(16, 32, requires_grad=True)
    loss, flow = gradient_flow(model, x, torch.randn(16, 32))
    print(f"loss {loss:.4f}; backward order (output -> input):")
    print(f"{'layer':<8}{'|grad_output|':>16}{'|grad_input|':>16}")
    for name, gin, gout in flow:
        print(f"{name:<8}{gout:>16.3e}{gin:>16.3e}")
    ratio = flow[-1][1] / flow[0][2]
    print(f"gradient shrinks by {ratio:.2e} from the last layer's output to the input"
          + ("  -> vanishing gradients" if ratio < 1e-2 else ""))

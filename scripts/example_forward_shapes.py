"""Print every layer's output shape with forward hooks (a model summary).

    python scripts/example_forward_shapes.py
"""
import distgrad as torch
import distgrad.nn as nn


def summarize(model, example):
    rows = []

    def hook(module, args, output):
        params = sum(p.numel() for p in module.parameters(recurse=False))
        rows.append((names[module], type(module).__name__, tuple(output.shape), params))

    names = {m: name or "(model)" for name, m in model.named_modules()}
    handles = [m.register_forward_hook(hook) for m in model.modules()]
    try:
        with torch.no_grad():
            model(example)
    finally:
        for h in handles:
            h.remove()
    print(f"{'layer':<10}{'type':<14}{'output shape':<18}{'params':>8}")
    for name, kind, shape, params in rows:
        print(f"{name:<10}{kind:<14}{str(shape):<18}{params:>8}")
    print(f"total parameters: {sum(p.numel() for p in model.parameters())}")


if __name__ == "__main__":
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.LayerNorm(32), nn.Dropout(0.1),
                          nn.Linear(32, 8), nn.Tanh(), nn.Linear(8, 3))
    summarize(model, torch.randn(4, 16))

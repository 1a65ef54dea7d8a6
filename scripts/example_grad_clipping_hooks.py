"""Gradient clipping with tensor hooks: each parameter's gradient is clamped as it is computed.

Compared with ``clip_grad_norm_`` after backward, a hook clips before the
gradient is accumulated into ``.grad`` (and before the optimizer sees it).

    python scripts/example_grad_clipping_hooks.py
"""
import distgrad as torch
import distgrad.nn as nn


def add_clipping_hooks(model, clip_value):
    clipped = []

    def make_hook(name):
        def hook(grad):
            over = (grad.abs() > clip_value).sum().item()
            if over:
                clipped.append((name, int(over)))
            return grad.clamp(-clip_value, clip_value)
        return hook

    handles = [p.register_hook(make_hook(n)) for n, p in model.named_parameters()]
    return handles, clipped


if __name__ == "__main__":
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
    x, y = torch.randn(64, 8) * 5, torch.randn(64, 1) * 50  # large targets: large gradients
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    handles, clipped = add_clipping_hooks(model, clip_value=0.5)
    for step in range(5):
        opt.zero_grad()
        loss = nn.MSELoss()(model(x), y)
        loss.backward()
        biggest = max(p.grad.abs().max().item() for p in model.parameters())
        print(f"step {step}: loss {loss.item():9.2f}  largest |grad| after hooks {biggest:.3f}")
        opt.step()
    print(f"hooks clipped {sum(n for _, n in clipped)} gradient entries in "
          f"{len({name for name, _ in clipped})} parameters")
    for h in handles:
        h.remove()
    opt.zero_grad()
    nn.MSELoss()(model(x), y).backward()
    print("without hooks, largest |grad|:",
          round(max(p.grad.abs().max().item() for p in model.parameters()), 3))

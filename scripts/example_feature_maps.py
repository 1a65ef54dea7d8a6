"""Feature extraction: forward hooks capture intermediate activations by layer name.

    python scripts/example_feature_maps.py
"""
import distgrad as torch
import distgrad.nn as nn


class FeatureExtractor:
    """Keeps the outputs of the named layers of ``model`` during each forward."""

    def __init__(self, model, layer_names):
        self.features = {}
        modules = dict(model.named_modules())
        self.handles = [modules[name].register_forward_hook(self._save(name))
                        for name in layer_names]

    def _save(self, name):
        def hook(module, args, output):
            self.features[name] = output.detach()
        return hook

    def close(self):
        for h in self.handles:
            h.remove()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class Encoder(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(50, 16)
        self.block = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 16))
        self.norm = nn.LayerNorm(16)
        self.head = nn.Linear(16, 4)

    def forward(self, tokens):
        h = self.embed(tokens)
        h = self.norm(h + self.block(h))
        return self.head(h.mean(1))


if __name__ == "__main__":
    torch.manual_seed(0)
    model = Encoder().eval()
    tokens = torch.randint(0, 50, (3, 7))
    with FeatureExtractor(model, ["embed", "block.1", "norm", "head"]) as fx:
        logits = model(tokens)
    for name, feat in fx.features.items():
        print(f"{name:<8} shape {str(tuple(feat.shape)):<12} mean {feat.mean().item():+.4f} "
              f"std {feat.std().item():.4f}")
    print("logits argmax per sequence:", logits.argmax(1).tolist())
    print("normalised features have mean ~0 and std ~1 per token:",
          round(fx.features["norm"].mean(-1).abs().max().item(), 6))

"""Built-in model factories for launch configs (``model.factory = "mlp"``).

A factory is any function returning an ``nn.Sequential``: the launcher splits its
layers into pipeline stages. Every stage builds the whole model from the same seed
and keeps its own slice, so the parameters equal those of the model built in one
process.

>>> len(mlp([2, 16, 2]))           # Linear, Tanh, Linear
3
"""
from distgrad import nn

__all__ = ["mlp", "BUILTIN"]

_ACTIVATIONS = {"tanh": nn.Tanh, "relu": nn.ReLU, "gelu": nn.GELU, "sigmoid": nn.Sigmoid}


def mlp(sizes, activation="tanh", dropout=0.0):
    """Linear layers of widths ``sizes`` (input first, output last), an activation
    (and optional dropout) after every one but the last."""
    if not isinstance(sizes, (list, tuple)) or len(sizes) < 2 \
            or not all(isinstance(s, int) and s > 0 for s in sizes):
        raise ValueError(f"sizes must list at least two positive widths, got {sizes!r}")
    if activation not in _ACTIVATIONS:
        raise ValueError(f"activation must be one of {', '.join(_ACTIVATIONS)}, "
                         f"got {activation!r}")
    if not 0.0 <= dropout < 1.0:
        raise ValueError(f"dropout must be in [0, 1), got {dropout!r}")
    layers = []
    for i, (n_in, n_out) in enumerate(zip(sizes[:-1], sizes[1:])):
        layers.append(nn.Linear(n_in, n_out))
        if i < len(sizes) - 2:
            layers.append(_ACTIVATIONS[activation]())
            if dropout:
                layers.append(nn.Dropout(dropout))
    return nn.Sequential(*layers)


#: built-in names accepted by ``model.factory``
BUILTIN = {"mlp": mlp}

"""How a run of an experiment trains its model: which library, and which activation
checkpointing (offloading is the run's offload table, :mod:`distgrad.offload.config`).

The model is ``layers`` blocks of (Linear, activation), built by distgrad from the seed;
a ``framework = "torch"`` run copies those weights into the same PyTorch model, so
both libraries train the same numbers. Checkpointing splits the blocks into
``segments`` runs of consecutive blocks and checkpoints each (non-reentrant):

* ``"full"``: every op of a segment is recomputed in backward;
* ``"selective"``: the linear layers' outputs are kept from the forward and only the
  activations are recomputed (``create_selective_checkpoint_contexts`` with
  ``aten.linear.default``; PyTorch's linear is ``aten.addmm`` / ``aten.mm``).
"""
import functools
import math

import distgrad
import distgrad.utils.checkpoint  # noqa: F401 - distgrad.utils.checkpoint, as torch's
from distgrad import nn

__all__ = ["CHECKPOINTS", "FRAMEWORKS", "default_segments", "build"]

CHECKPOINTS = ("none", "full", "selective")
FRAMEWORKS = ("distgrad", "torch")


def default_segments(layers):
    """About sqrt(layers) segments: what keeps the fewest activations when each segment's
    own are recomputed at once (Chen et al. 2016)."""
    return max(1, round(math.sqrt(layers)))


def _distgrad_model(m):
    distgrad.manual_seed(m["seed"])
    act = {"tanh": nn.Tanh, "relu": nn.ReLU, "gelu": nn.GELU, "sigmoid": nn.Sigmoid}[
        m["activation"]]
    model = nn.Sequential(*[layer for _ in range(m["layers"])
                            for layer in (nn.Linear(m["width"], m["width"]), act())])
    return model, distgrad.randn(m["batch"], m["width"])


def _torch_model(m, model, x):
    import torch
    torch.set_num_threads(1)
    act = {"tanh": torch.nn.Tanh, "relu": torch.nn.ReLU, "gelu": torch.nn.GELU,
           "sigmoid": torch.nn.Sigmoid}[m["activation"]]
    theirs = torch.nn.Sequential(*[layer for _ in range(m["layers"])
                                   for layer in (torch.nn.Linear(m["width"], m["width"]),
                                                 act())])
    theirs.load_state_dict({k: torch.from_numpy(v.numpy().copy())
                            for k, v in model.state_dict().items()})
    return theirs, torch.from_numpy(x.numpy().copy())


def _keep_linear_outputs(lib):
    aten = lib.ops.aten
    ops = [aten.linear.default] if lib.__name__ == "distgrad" else \
        [aten.addmm.default, aten.mm.default]
    return functools.partial(lib.utils.checkpoint.create_selective_checkpoint_contexts, ops)


def _checkpointed(lib, model, how, segments):
    """A forward of ``model`` checkpointing ``segments`` runs of its blocks ``how`` says."""
    layers = list(model)
    blocks = [layers[i:i + 2] for i in range(0, len(layers), 2)]
    per = math.ceil(len(blocks) / segments)
    groups = [sum(blocks[i:i + per], []) for i in range(0, len(blocks), per)]
    context_fn = _keep_linear_outputs(lib) if how == "selective" else \
        lib.utils.checkpoint.noop_context_fn
    checkpoint = lib.utils.checkpoint.checkpoint

    def run(group):
        def segment(x):
            for layer in group:
                x = layer(x)
            return x
        return segment
    runs = [run(group) for group in groups]

    def forward(x):
        for segment in runs:
            x = checkpoint(segment, x, use_reentrant=False, context_fn=context_fn)
        return x
    return forward


def build(model_config, run):
    """``(model, inputs, forward)`` of ``run`` (a [[run]] table) on ``model_config``:
    ``forward(inputs)`` is the run's forward (None: the model's own)."""
    model, x = _distgrad_model(model_config)
    lib = distgrad
    if run.get("framework", "distgrad") == "torch":
        import torch  # only this run's process needs PyTorch
        import torch.utils.checkpoint  # noqa: F401
        model, x = _torch_model(model_config, model, x)
        lib = torch
    how = run.get("checkpoint", "none")
    if how == "none":
        return model, x, None
    segments = run.get("segments", default_segments(model_config["layers"]))
    return model, x, _checkpointed(lib, model, how, segments)

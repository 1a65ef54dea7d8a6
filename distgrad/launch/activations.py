"""``model.checkpoint_activations``: a stage's forward under activation checkpointing.

With ``"stage"`` a stage keeps only its input for each micro-batch's backward and reruns
its layers when that backward starts (the re-materialization of GPipe); with
``"layer"`` it keeps every layer's input and reruns one layer at a time. Either way the
gradients, and so the run, are those without checkpointing, bit for bit
(non-reentrant ``distgrad.utils.checkpoint``, which also serves the distributed
backward of ``world.strategy = "autograd"``).

The stage's module stays a Sequential of the same layers under the same names, so its
state dict, its checkpoints and its parameters' names do not change.
"""
from collections import OrderedDict

from distgrad import nn
from distgrad.utils.checkpoint import checkpoint

from .config import SCHEMA

__all__ = ["MODES", "checkpointed"]

#: values of ``model.checkpoint_activations``
MODES = SCHEMA["model"]["checkpoint_activations"].choices


class _CheckpointedStage(nn.Sequential):
    granularity = "stage"

    def forward(self, x):
        if self.granularity == "stage":
            return checkpoint(super().forward, x, use_reentrant=False)
        for layer in self:
            x = checkpoint(layer, x, use_reentrant=False)
        return x


def checkpointed(module, mode):
    """``module`` (a Sequential) run as ``mode`` says (one of :data:`MODES`)."""
    if mode not in MODES:
        raise ValueError(f"checkpoint_activations must be one of {', '.join(MODES)}, "
                         f"got {mode!r}")
    if mode == "none":
        return module
    stage = _CheckpointedStage(OrderedDict(module.named_children()))
    stage.granularity = mode
    stage.train(module.training)
    return stage

"""Built-in training hooks, attached by reference from a config's ``[[hooks]]``.

A hook is a module-level function ``hook(module, **kwargs)`` that runs on every
stage after the step's backward pass and before its optimizer step; ``module`` is
the stage's part of the model with its gradients accumulated. It may change the
gradients, and what it returns (a dict of numbers, or None) is logged in the
run's metrics as ``<key>.stage<N>``::

    [[hooks]]
    ref = "distgrad.launch.hooks:clip_grad_norm"
    max_norm = 1.0

Stages see only their own parameters, so norms and clipping here are per stage.
With data-parallel replicas hooks run after the replicas' gradients are averaged,
so every replica clips alike and stays identical.
"""
import math

from distgrad.nn.utils import clip_grad_norm_

__all__ = ["grad_norm", "clip_grad_norm"]


def grad_norm(module, norm_type=2.0):
    """Log the norm of the stage's gradients."""
    norms = [float((p.grad.abs() ** norm_type).sum()) for p in module.parameters()
             if p.grad is not None]
    return {"grad_norm": math.fsum(norms) ** (1.0 / norm_type)}


def clip_grad_norm(module, max_norm, norm_type=2.0):
    """Scale the stage's gradients so their norm is at most ``max_norm``; log the norm
    before clipping."""
    total = clip_grad_norm_(module.parameters(), max_norm, norm_type=norm_type)
    return {"grad_norm": float(total)}

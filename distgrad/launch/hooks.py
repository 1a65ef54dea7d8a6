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

With ``world.strategy = "autograd"`` hooks of the other kinds run in the coordinator
(see :mod:`distgrad.launch.coordinator_hooks`), fired by the stages::

    [[hooks]]
    ref = "distgrad.launch.hooks:activation_stats"     # each stage's output
    kind = "forward"

    [[hooks]]
    ref = "distgrad.launch.hooks:grad_output_norm"     # the gradient reaching each stage
    kind = "full_backward"

    [[hooks]]
    ref = "distgrad.launch.hooks:tensor_grad_norm"     # one parameter's step gradient
    kind = "tensor_grad"
    parameter = "0.weight"
"""
import math

from distgrad.nn.utils import clip_grad_norm_

__all__ = ["grad_norm", "clip_grad_norm", "activation_stats", "grad_output_norm",
           "tensor_grad_norm"]


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


def _norm(tensors, norm_type):
    parts = [float((t.abs() ** norm_type).sum()) for t in tensors if t is not None]
    return math.fsum(parts) ** (1.0 / norm_type)


def activation_stats(module_name, inputs, output):
    """Kind "forward": the mean and standard deviation of a stage's output."""
    return {"act_mean": float(output.mean()), "act_std": float(output.std())}


def grad_output_norm(module_name, grad_input, grad_output, norm_type=2.0):
    """Kind "full_backward": the norm of the gradient with respect to a stage's output."""
    return {"grad_out_norm": _norm(grad_output, norm_type)}


def tensor_grad_norm(grad, norm_type=2.0):
    """Kind "tensor_grad": the norm of a parameter's gradient."""
    return {"param_grad_norm": _norm([grad], norm_type)}

"""A stage's backward pass, whole or split into its inputs' part and its weights' part
(``torch.distributed.pipelining._backward``).

Zero-bubble schedules run ``I`` (:func:`stage_backward_input`: the gradients the stage
before waits for) as soon as they can and ``W`` (:func:`stage_backward_weight`: the
parameters' gradients) later, in a slot that would otherwise be idle. PyTorch splits by
walking the autograd graph and running it twice. Here one backward pass runs at ``I``:

* linear layers' weight products are not computed there: the layers keep their two
  factors (``distgrad.autograd.defer_weight_grads``) and ``W`` multiplies them, so the
  larger half of a linear layer's backward moves to ``W``;
* every other parameter gradient the pass computes (biases, norms, convolutions) is
  held, not accumulated, and ``W`` accumulates it,

so after ``I`` no ``.grad`` has changed and after ``W`` every one has, as in PyTorch,
and the sums are those of a plain backward of the micro-batch.
"""
import numpy as np

import distgrad
from distgrad.autograd import Tensor, defer_weight_grads
from distgrad.autograd._internal import accumulate_into_grad, make_root_grads
from distgrad.autograd.engine import run_backward

__all__ = ["stage_backward", "stage_backward_input", "stage_backward_weight"]


def _differentiable(outputs, grads):
    """The outputs that take part in backward, with their gradients (None where given
    None), from nested outputs and gradients of the same structure."""
    outs, gs = [], []

    def walk(o, g):
        if isinstance(o, Tensor):
            if o.requires_grad or o.grad_fn is not None:
                if g is not None and not isinstance(g, Tensor):
                    raise AssertionError(f"Expected Tensor or None gradient but got {type(g)}")
                outs.append(o)
                gs.append(g)
        elif isinstance(o, (tuple, list)):
            if g is None:
                g = [None] * len(o)
            if len(o) != len(g):
                raise AssertionError(f"Expected len(output_val) == len(grad_val), got "
                                     f"{len(o)} != {len(g)}")
            for oi, gi in zip(o, g):
                walk(oi, gi)
        elif isinstance(o, dict):
            g = g or {}
            for k in o:
                walk(o[k], g.get(k))
    walk(outputs, grads)
    return outs, gs


def stage_backward(stage_output, output_grads, input_values, outputs_with_grads_idxs=None):
    """Backward from ``stage_output`` (the loss, or the outputs with ``output_grads``):
    parameters' gradients accumulate into ``.grad``; returns the gradients of
    ``input_values`` (None for a non-tensor or one without a gradient)."""
    if outputs_with_grads_idxs is not None:  # deprecated in PyTorch too
        stage_output = [stage_output[i] for i in outputs_with_grads_idxs]
        output_grads = [output_grads[i] for i in outputs_with_grads_idxs]
    outs, gs = _differentiable(stage_output, output_grads)
    if outs:
        distgrad.autograd.backward(outs, grad_tensors=gs)
    grads = []
    for v in input_values:
        if isinstance(v, Tensor):
            grads.append(v.grad)
            v.grad = None  # sent on, not accumulated: the next micro-batch starts afresh
        else:
            grads.append(None)
    return tuple(grads)


class _HeldGradients:
    """Leaf gradients of one ``I`` pass, held until its ``W``: the engine hands each leaf's
    gradient here instead of accumulating it, and deferred linear weights' products come
    here when ``W`` computes them."""

    def __init__(self, weights, inputs):
        self.params = weights
        self.inputs = {id(t): t for t in inputs}
        self.input_grads = {}
        self.held = []   # [(leaf, gradient array)] in the order the pass produced them
        self.deferral = None

    def keep(self, variable, g, owned):
        if id(variable) in self.inputs:
            self.input_grads[id(variable)] = g if owned else np.array(g)
        else:
            self.held.append((variable, g if owned else np.array(g)))

    def apply(self):
        if self.deferral is not None:
            self.deferral.flush()  # the linear weights' products, through keep()
            self.deferral = None
        held, self.held = self.held, []
        for variable, g in held:
            accumulate_into_grad(variable, g, owned=True)


def stage_backward_input(stage_outputs_or_loss, output_grads, input_values, weights):
    """The gradients of ``input_values`` only; returns ``(input gradients, param_groups)``,
    the second for :func:`stage_backward_weight`, which completes the backward. Each
    input's gradient also accumulates into its ``.grad``, as in PyTorch."""
    outs, gs = _differentiable(stage_outputs_or_loss, output_grads)
    weights = [w for w in weights if w.requires_grad and w.is_leaf]
    inputs = [v for v in input_values if isinstance(v, Tensor) and v.requires_grad]
    held = _HeldGradients(weights, [v for v in inputs if v.is_leaf])
    captured = {}
    handles = [v.register_hook(lambda g, k=id(v): captured.__setitem__(k, g))
               for v in inputs if not v.is_leaf]  # a view's gradient passes through it
    held.deferral = defer_weight_grads(weights).activate() if weights else None
    try:
        if outs:
            if output_grads is None:  # the loss: d loss / d loss = 1
                gs = [distgrad.ones_like(o) for o in outs]
            roots = make_root_grads(outs, gs, False)
            run_backward(outs, roots, retain_graph=False, create_graph=False, inputs=(),
                         allow_unused=True, accumulate_grad=True, accumulate=held.keep)
    except BaseException:
        if held.deferral is not None:
            held.deferral.deactivate()
            held.deferral.discard()
        raise
    finally:
        for h in handles:
            h.remove()
    if held.deferral is not None:
        held.deferral.deactivate()  # what it kept waits for W
    dinputs = []
    for v in input_values:
        g = None
        if isinstance(v, Tensor):
            g = captured.get(id(v))
            if g is None and id(v) in held.input_grads:
                g = distgrad.from_numpy(held.input_grads[id(v)])
            if g is not None:
                v.grad = g if v.grad is None else v.grad + g
        dinputs.append(g)
    return tuple(dinputs), [{"params": weights, "held": held}]


def stage_backward_weight(weights, param_groups, retain_graph=False):
    """Complete a backward that :func:`stage_backward_input` began: accumulate the
    parameters' gradients into ``.grad``; returns the gradients of ``weights``."""
    weights = list(weights)
    for group in param_groups:
        group["held"].apply()
    return tuple(w.grad for w in weights)

"""The hooks a backward pass calls around a node, in PyTorch's order.

Before a node: the tensor hooks of each of its outputs' gradients (``Tensor.register_hook``;
on a leaf they live on the tensor), then ``retain_grad``'s, then the node's own pre-hooks
(``Node.register_prehook``). After it: its post-hooks (``Node.register_hook``). A hook sees
Tensors and may return replacements; the engine keeps ndarrays unless
``create_graph=True``, so values are wrapped for the hook and unwrapped after.
"""
from .grad_mode import _state
from .node import AccumulateGrad
from .tensor import TensorBase, _make

__all__ = ["has_pre_hooks", "call_pre_hooks", "call_tensor_pre_hooks", "call_post_hooks"]


def has_pre_hooks(node):
    """Whether anything must run before ``node`` (the engine asks for every node)."""
    return bool(node._pre_hooks or node._tensor_pre_hooks or node._retains_grad_hooks or (
        type(node) is AccumulateGrad and node._has_any_pre_hooks()))


def call_pre_hooks(node, grads):
    """The gradients ``node`` runs on, after its tensor hooks and pre-hooks."""
    grads = call_tensor_pre_hooks(node, grads)
    if node._pre_hooks:
        grads = _call_node_pre_hooks(node, grads)
    return grads


def _to_user(g):
    return g if (g is None or isinstance(g, TensorBase)) else _make(g)


def _from_user(value):
    if value is None or _state.grad_enabled:
        return value
    if isinstance(value, TensorBase):
        return value._data
    return value


def call_tensor_pre_hooks(node, grads):
    grads = list(grads)
    for nr in range(len(grads)):
        hooks = node._tensor_hooks_for(nr)
        if hooks and grads[nr] is not None:
            g = grads[nr]
            for hook in hooks:
                result = hook(_to_user(g))
                if result is not None:
                    if not isinstance(result, TensorBase):
                        raise TypeError(f"hook returned a {type(result).__name__}, "
                                        "expected a Tensor or None")
                    g = _from_user(result)
            grads[nr] = g
    retains = node._retains_grad_hooks
    if retains:
        for nr, hook in list(retains.items()):
            if nr < len(grads) and grads[nr] is not None:
                hook(_to_user(grads[nr]) if _state.grad_enabled else grads[nr])
    return grads


def _call_node_pre_hooks(node, grads):
    for hook in tuple(node._pre_hooks.values()):
        result = hook(tuple(_to_user(g) for g in grads))
        if result is not None:
            result = tuple(result)
            if len(result) != len(grads):
                raise RuntimeError(f"hook returned {len(result)} gradients for {node.name()}, "
                                   f"expected {len(grads)}")
            grads = [_from_user(r) for r in result]
    return grads


def call_post_hooks(node, outputs, grads):
    """``node``'s outputs after its post-hooks (``grads``: what it ran on)."""
    user_outputs = tuple(_to_user(g) for g in grads)
    for hook in tuple(node._post_hooks.values()):
        result = hook(tuple(_to_user(o) for o in outputs), user_outputs)
        if result is not None:
            result = tuple(result)
            if len(result) != len(outputs):
                raise RuntimeError(f"hook returned {len(result)} gradients for {node.name()}, "
                                   f"expected {len(outputs)}")
            outputs = tuple(_from_user(r) for r in result)
    return outputs

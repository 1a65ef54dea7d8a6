"""What fused ops (convolution, pooling, batch norm, recurrent layers) share.

A fused op is one graph node whose VJP is written in NumPy for speed. Its VJP
still has to work when ``xp`` records a graph (``create_graph=True``), so that
gradients of gradients exist. Two ways serve here:

* the VJP is itself a fused op: :func:`call_fused` runs a NumPy kernel directly
  in an ordinary backward and records it as a node of its own under
  ``create_graph`` (convolution and average pooling, whose VJPs are again
  convolutions and poolings, close this way);
* the VJP differentiates a reference implementation written from differentiable
  ops (recurrent layers; see ``ops/rnn.py``).
"""
from ..autograd._internal import array_of, record
from ..autograd.dtype import scalar_type_name

__all__ = ["call_fused", "require_floating", "scalar_type_name"]


def require_floating(op_name, *tensors):
    """PyTorch's error for an op that has no kernel for integer, boolean or complex data."""
    for t in tensors:
        if t is not None and array_of(t).dtype.kind != "f":
            raise NotImplementedError(
                f"\"{op_name}\" not implemented for '{scalar_type_name(array_of(t).dtype)}'")


def call_fused(xp, node_cls, kernel, args, meta):
    """``kernel(*arrays, meta)`` on the VJP's own arguments.

    In an ordinary backward ``args`` are ndarrays and the kernel runs as is; under
    ``create_graph`` they are Tensors, and the result is recorded as a
    ``node_cls`` node (saving ``args``), whose VJPs the caller declared.
    """
    if xp.is_tensor_backend():
        arrays = [array_of(a) for a in args]
        return record(node_cls, kernel(*arrays, meta), tuple(args), tuple(args), meta)
    return kernel(*args, meta)

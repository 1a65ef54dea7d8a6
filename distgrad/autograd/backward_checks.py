"""What a backward pass checks: the gradients it starts with, what a node returns, and
each gradient against the input it is for (PyTorch's ``validate_outputs``).

A node's gradient for an input may come back broadcast (VJP rules return the output's
shape) or in another dtype; :func:`conform` reduces and casts it to the input's
recorded shape and dtype, in one place for every op, and raises PyTorch's error for a
shape that no reduction explains.
"""
import numpy as np

from .broadcast import reduction_axes, sum_to_shape
from .naming import public_name
from .tensor import ArrayStorage, TensorBase, _make

__all__ = ["make_root_grads", "check_output_count", "conform"]


def make_root_grads(outputs, grad_outputs, create_graph):
    """The checked gradients to start a backward with (ones for scalar outputs)."""
    grads = []
    for i, (out, g) in enumerate(zip(outputs, grad_outputs)):
        if not isinstance(out, TensorBase):
            raise TypeError(f"element {i} of outputs is a {type(out).__name__}, not a Tensor")
        if g is None:
            if not out._requires_grad:
                grads.append(None)
                continue
            if out._data.size != 1:
                raise RuntimeError("grad can be implicitly created only for scalar outputs")
            if out._data.dtype.kind == "c":
                raise RuntimeError("grad can be implicitly created only for real scalar outputs "
                                   f"but got {out.dtype!r}")
            arr = np.ones(out._data.shape, dtype=out._data.dtype)
            grads.append(_make(arr) if create_graph else arr)
            continue
        if not isinstance(g, TensorBase):
            if isinstance(g, (int, float, complex, np.ndarray)):
                g = _make(np.asarray(g, dtype=out._data.dtype))
            else:
                raise TypeError(f"gradients can be either Tensors or None, but got "
                                f"{type(g).__name__}")
        if g._data.shape != out._data.shape:
            raise RuntimeError(
                f"Mismatch in shape: grad_output[{i}] has a shape of {_size(g)} and output[{i}] "
                f"has a shape of {_size(out)}.")
        if (g._data.dtype.kind == "c") != (out._data.dtype.kind == "c"):
            raise RuntimeError("For complex Tensors, both grad_output and output are required to "
                               f"have the same dtype. Mismatch in dtype: grad_output[{i}] has a "
                               f"dtype of {g.dtype!r} and output[{i}] has a dtype of {out.dtype!r}.")
        grads.append(g if create_graph else g._data)
    return grads


def _size(t):
    return f"{public_name()}.Size({list(t._data.shape)})"


def check_output_count(node, outputs):
    if len(outputs) != len(node._next):
        raise RuntimeError(f"function {node.name()} returned an incorrect number of gradients "
                           f"(expected {len(node._next)}, got {len(outputs)})")


def conform(node, nxt, input_nr, g, create_graph):
    """``g`` (from ``node``, for input ``input_nr`` of ``nxt``) reduced and cast to that
    input's shape and dtype: an ndarray, or a Tensor under ``create_graph``. The engine
    calls this only when the gradient is not already a plain array of the right kind."""
    shape, dtype = nxt._out_meta[input_nr]
    if isinstance(g, TensorBase):
        if not create_graph:
            g = g._data
        else:
            if g._data.shape != shape:
                if reduction_axes(g._data.shape, shape) is None:
                    _invalid_shape(node, g._data.shape, shape)
                g = g.sum_to_size(shape)
            if g._data.dtype != dtype:
                if g._data.dtype.kind == "c" and dtype.kind != "c":
                    g = g.real
                g = g.to(dtype)
            return g
    elif create_graph:
        return conform(node, nxt, input_nr, _make(np.asarray(g)), create_graph)
    elif type(g) is not np.ndarray and not isinstance(g, ArrayStorage):
        g = np.asarray(g)  # a NumPy scalar from a full reduction (a sparse gradient stays)
    if g.shape != shape:
        if reduction_axes(g.shape, shape) is None:
            _invalid_shape(node, g.shape, shape)
        g = sum_to_shape(g, shape)
    if g.dtype != dtype:
        if g.dtype.kind == "c" and dtype.kind != "c":
            g = g.real
        g = g.astype(dtype)
    return g


def _invalid_shape(node, got, expected):
    raise RuntimeError(f"Function {node.name()} returned an invalid gradient - got "
                       f"{list(got)} but expected shape compatible with {list(expected)}")

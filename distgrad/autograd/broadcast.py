"""The one unbroadcast of the project: reduce a broadcast gradient to its input's shape.

The engine applies it to every gradient an op returns (PyTorch's
``validate_outputs``), so VJP rules never call it themselves.
"""
import numpy as np

__all__ = ["reduction_axes", "sum_to_shape"]


def reduction_axes(grad_shape, shape):
    """Axes of ``grad_shape`` to sum so that it becomes ``shape``; None if not expandable."""
    lead = len(grad_shape) - len(shape)
    if lead < 0:
        return None
    axes = list(range(lead))
    for i, size in enumerate(shape):
        gsize = grad_shape[lead + i]
        if size == gsize:
            continue
        if size != 1:
            return None
        axes.append(lead + i)
    return tuple(axes)


def sum_to_shape(grad, shape):
    """``grad`` (an ndarray) summed over its broadcast dimensions down to ``shape``.

    >>> sum_to_shape(np.ones((4, 2, 3)), (2, 1)).tolist()
    [[12.0], [12.0]]
    """
    axes = reduction_axes(grad.shape, shape)
    if axes is None:
        raise ValueError(f"gradient of shape {list(grad.shape)} cannot be reduced to {list(shape)}")
    if axes:
        grad = grad.sum(axis=axes)
    return np.asarray(grad).reshape(shape)

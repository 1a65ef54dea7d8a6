"""Channel-wise dropout (``dropout1d``, ``dropout2d``): whole feature maps are zeroed.

One Bernoulli draw per (sample, channel), broadcast over the spatial axes, and the
kept channels scaled by ``1 / (1 - p)``; the gradient flows through the product
with that mask (``MulBackward0``, as in PyTorch).
"""
import warnings

import numpy as np

from .creation import _rng
from ..autograd._internal import array_of, wrap

__all__ = ["dropout1d", "dropout2d"]


def _check_p(p):
    if p < 0.0 or p > 1.0:
        raise ValueError(f"dropout probability has to be between 0 and 1, but got {p}")


def _channel_dropout(input, p, training, inplace, channel_axis):
    """Zero whole slices ``input[..., c, ...]`` below ``channel_axis`` + 1 with probability p."""
    if not training or p == 0.0:
        return input
    d = array_of(input)
    shape = d.shape[:channel_axis + 1] + (1,) * (d.ndim - channel_axis - 1)
    if p == 1.0:
        mask = np.zeros(shape, dtype=d.dtype)
    else:
        mask = (_rng(None).random(shape) >= p).astype(d.dtype) / np.asarray(1.0 - p, d.dtype)
    return input.mul_(wrap(mask)) if inplace else input * wrap(mask)


def dropout1d(input, p=0.5, training=True, inplace=False):
    """Zero whole channels of (N, C, L) or (C, L), as ``torch.nn.functional.dropout1d``."""
    _check_p(p)
    ndim = input.dim()
    if ndim not in (2, 3):
        raise RuntimeError(f"dropout1d: Expected 2D or 3D input, but received a {ndim}D input. "
                           "Note that dropout1d exists to provide channel-wise dropout on inputs "
                           "with 1 spatial dimension, a channel dimension, and an optional batch "
                           "dimension (i.e. 2D or 3D inputs).")
    return _channel_dropout(input, p, training, inplace, 1 if ndim == 3 else 0)


def dropout2d(input, p=0.5, training=True, inplace=False):
    """Zero whole channels of (N, C, H, W), as ``torch.nn.functional.dropout2d``.

    As in PyTorch, a 3-D input is read as (N, C, L) (with a warning), not as an
    unbatched (C, H, W).
    """
    _check_p(p)
    ndim = input.dim()
    if ndim not in (3, 4):
        warnings.warn(f"dropout2d: Received a {ndim}-D input to dropout2d, which is deprecated "
                      "and will result in an error in a future release. To retain the behavior "
                      "and silence this warning, please use dropout instead. Note that dropout2d "
                      "exists to provide channel-wise dropout on inputs with 2 spatial "
                      "dimensions, a channel dimension, and an optional batch dimension (i.e. 3D "
                      "or 4D inputs).", stacklevel=2)
    if ndim == 3:
        warnings.warn("dropout2d: Received a 3D input to dropout2d and assuming that channel-wise "
                      "1D dropout behavior is desired - input is interpreted as shape (N, C, L), "
                      "where C is the channel dim. This behavior will change in a future release "
                      "to interpret the input as one without a batch dimension, i.e. shape "
                      "(C, H, W). To maintain the 1D channel-wise dropout behavior, please switch "
                      "to using dropout1d instead.", stacklevel=2)
    return _channel_dropout(input, p, training, inplace, min(1, ndim - 1))

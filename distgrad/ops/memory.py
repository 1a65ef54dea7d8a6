"""What a tensor tells about its memory: ``data_ptr`` and ``storage_offset``.

A tensor's memory is its NumPy array's: ``data_ptr`` is the address of its first
element (views of one buffer differ by their offset, as PyTorch's), 0 for a tensor
without elements; ``storage_offset`` counts elements from the start of the buffer
the array views. A sparse tensor has no single buffer; asking raises, as in PyTorch.
"""
import numpy as np

from ..autograd._internal import array_of

__all__ = ["data_ptr", "storage_offset"]

_NO_STORAGE = "Cannot access data pointer of Tensor that doesn't have storage"


def _array(t):
    data = array_of(t)
    if type(data) is not np.ndarray:
        raise RuntimeError(_NO_STORAGE)
    return data


def data_ptr(self):
    """The address of the first element (0 when there is none)."""
    a = _array(self)
    return 0 if a.size == 0 else a.__array_interface__["data"][0]


def _buffer_start(a):
    while isinstance(a.base, np.ndarray):
        a = a.base
    return a.__array_interface__["data"][0]


def storage_offset(self):
    """Elements between the start of the underlying buffer and the first element."""
    a = _array(self)
    if a.size == 0:
        return 0
    return (a.__array_interface__["data"][0] - _buffer_start(a)) // a.itemsize

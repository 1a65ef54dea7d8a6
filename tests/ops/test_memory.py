"""``Tensor.data_ptr`` and ``storage_offset``, as PyTorch's."""
import pytest

import distgrad
from distgrad.testing.oracle import torch


def _facts(m):
    x = m.zeros(4, 3)
    row = x[1]
    return {"view_offset": row.data_ptr() - x.data_ptr(), "same": x.view(12).data_ptr() ==
            x.data_ptr(), "clone": x.clone().data_ptr() != x.data_ptr(),
            "offsets": (x.storage_offset(), row.storage_offset(), x[2:, 1:].storage_offset()),
            "empty": m.empty(0).data_ptr(), "detach": x.detach().data_ptr() == x.data_ptr()}


def test_data_ptr_and_storage_offset():
    ours = _facts(distgrad)
    assert ours["view_offset"] == 12 and ours["offsets"] == (0, 3, 7) and ours["empty"] == 0
    if torch is not None:
        assert ours == _facts(torch)


def test_a_sparse_tensor_has_no_data_pointer():
    s = distgrad.sparse_coo_tensor([[0]], [1.0], (2,))
    with pytest.raises(RuntimeError, match="doesn't have storage"):
        s.data_ptr()

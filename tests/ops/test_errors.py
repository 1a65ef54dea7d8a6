"""Bad input raises the exception class PyTorch raises, with a message naming what is wrong."""
import pytest

import distgrad
from distgrad.testing.oracle import torch

CASES = [
    ("matmul_shapes", lambda m: m.ones(2, 3) @ m.ones(4, 5), r"cannot be multiplied \(2x3 and 4x5\)"),
    ("matmul_0d", lambda m: m.matmul(m.tensor(1.0), m.ones(2)), "at least 1D"),
    ("linear_shapes", lambda m: m.nn.functional.linear(m.ones(2, 3), m.ones(4, 5)),
     "cannot be multiplied"),
    ("cat_sizes", lambda m: m.cat([m.ones(2, 3), m.ones(3, 4)], 0), "Sizes of tensors must match"),
    ("stack_sizes", lambda m: m.stack([m.ones(2), m.ones(3)]), "stack expects each tensor"),
    ("view_numel", lambda m: m.ones(6).view(4, 2), "invalid for input of size 6"),
    ("reshape_two_infer", lambda m: m.ones(6).reshape(-1, -1), "only one dimension can be inferred"),
    ("dim_range", lambda m: m.ones(2, 3).sum(5), "Dimension out of range"),
    ("index_range", lambda m: m.ones(3)[5], "out of bounds|out of range"),
    ("index_float", lambda m: m.ones(3)[m.tensor([0.5])], "tensors used as indices"),
    ("expand_bad", lambda m: m.ones(2, 3).expand(4, 3), "expanded size"),
    ("permute_len", lambda m: m.ones(2, 3).permute(0), "number of dimensions"),
    ("split_sum", lambda m: m.ones(5).split([2, 2]), "split_with_sizes expects split_sizes to sum"),
    ("item_many", lambda m: m.ones(3).item(), "cannot be converted to Scalar"),
    ("bool_many", lambda m: bool(m.ones(3)), "ambiguous"),
    ("int_requires_grad", lambda m: m.ones(3, dtype=m.int64).requires_grad_(), "floating point"),
    ("neg_bool", lambda m: -m.tensor([True]), "Negation"),
    ("sub_bool", lambda m: m.tensor([True]) - m.tensor([False]), "Subtraction"),
    ("where_cond", lambda m: m.where(m.ones(2), m.ones(2), m.ones(2)), "boolean|bool"),
    ("mean_int", lambda m: m.arange(3).mean(), "mean"),
    ("backward_nonscalar", lambda m: (m.ones(2, requires_grad=True) * 2).backward(),
     "implicitly created only for scalar outputs"),
    ("backward_no_grad", lambda m: m.ones(2).sum().backward(), "does not require grad"),
    ("grad_shape", lambda m: (m.ones(2, requires_grad=True) * 2).backward(m.ones(3)),
     "Mismatch in shape"),
    ("leaf_inplace", lambda m: m.ones(2, requires_grad=True).add_(1), "leaf Variable"),
    ("nll_target_range", lambda m: m.nn.functional.nll_loss(m.zeros(2, 3), m.tensor([0, 7])),
     "out of bounds"),
    ("layer_norm_shape", lambda m: m.nn.functional.layer_norm(m.ones(2, 3), (4,)),
     "normalized_shape"),
    ("t_3d", lambda m: m.ones(2, 2, 2).t(), "<= 2 dimensions"),
    ("gather_dims", lambda m: m.ones(2, 3).gather(1, m.tensor([0, 1])), "same number of dimensions"),
    ("mm_1d", lambda m: m.mm(m.ones(3), m.ones(3, 2)), "2D|matrix|must be"),
    ("tril_1d", lambda m: m.tril(m.ones(3)), "tril: input tensor must have at least 2 dimensions"),
]


def _raise(fn, module):
    with pytest.raises(Exception) as info:
        fn(module)
    return info


@pytest.mark.parametrize("name,fn,message", CASES, ids=[c[0] for c in CASES])
def test_error_class_and_message(name, fn, message):
    ours = _raise(fn, distgrad)
    assert ours.match(message), f"{name}: {ours.value!r}"
    if torch is not None:
        theirs = _raise(fn, torch)
        assert issubclass(ours.type, theirs.type) or issubclass(theirs.type, ours.type) or \
            ours.type is theirs.type, f"{name}: distgrad raises {ours.type.__name__}, " \
                                      f"PyTorch {theirs.type.__name__}"

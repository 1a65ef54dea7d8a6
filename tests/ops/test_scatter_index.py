"""scatter, scatter_add, index_add, index_fill, index_copy, masked_fill and their in-place
forms: values and gradients against PyTorch (or gradcheck), errors, version counters."""
import numpy as np
import pytest

import distgrad
from distgrad.testing.oracle import check_op, torch

pytestmark = pytest.mark.timeout(60)

IDX_ROWS = np.array([[0, 2, 1, 0], [2, 0, 0, 1]])           # for dim 0 of a (3, 4) tensor
IDX_COLS = np.array([[3, 0], [1, 3], [0, 2]])                # for dim 1, smaller than src
# scatter with a repeated target is nondeterministic (and PyTorch's gradient sends each
# repeat the output's gradient), so repeats are only tested where they accumulate.
IDX_REPEATS = np.array([[1, 1], [0, 0], [2, 2]])
VEC = np.array([2, 0, 2])                                    # index_add with a repeat
UNIQUE = np.array([2, 0])

CASES = [
    ("scatter_src_dim0", lambda m, x, s, i: x.scatter(0, i, s), [(3, 4), (2, 4), IDX_ROWS]),
    # PyTorch's own backward rejects a src larger than the index ("invalid gradient ... got
    # [3, 2] but expected shape compatible with [3, 5]"); distgrad gives the rest of src a
    # zero gradient, which is what PyTorch computes when src is sliced to the index first.
    ("scatter_src_dim1_larger_src", lambda m, x, s, i: m.scatter(x, 1, i, s),
     [(3, 4), (3, 5), IDX_COLS], lambda m, x, s, i: m.scatter(x, 1, i, s[:, :2])),
    ("scatter_value", lambda m, x, i: x.scatter(-1, i, 2.5), [(3, 4), IDX_COLS]),
    ("scatter_add", lambda m, x, s, i: x.scatter_add(0, i, s), [(3, 4), (2, 4), IDX_ROWS]),
    ("scatter_add_larger_src", lambda m, x, s, i: m.scatter_add(x, 1, i, s),
     [(3, 4), (4, 3), IDX_REPEATS], lambda m, x, s, i: m.scatter_add(x, 1, i, s[:3, :2])),
    ("index_add", lambda m, x, s, i: x.index_add(0, i, s), [(3, 4), (3, 4), VEC]),
    ("index_add_alpha_dim1", lambda m, x, s, i: m.index_add(x, 1, i, s, alpha=-1.5),
     [(2, 4), (2, 3), VEC]),
    ("index_fill", lambda m, x, i: x.index_fill(1, i, -1.0), [(3, 4), VEC]),
    ("index_fill_negative", lambda m, x: x.index_fill(0, m.tensor([-1, 0]), 7.0), [(3, 4)]),
    ("index_fill_tensor_value", lambda m, x, v, i: x.index_fill(0, i, v), [(3, 4), (), VEC]),
    ("index_copy", lambda m, x, s, i: x.index_copy(0, i, s), [(3, 4), (2, 4), UNIQUE]),
    ("index_copy_dim1", lambda m, x, s, i: m.index_copy(x, 1, i, s), [(3, 4), (3, 2), UNIQUE]),
    ("masked_fill", lambda m, x: x.masked_fill(x > 0.5, 0.0), [(3, 4)]),
    ("masked_fill_tensor_value", lambda m, x, v: x.masked_fill(x < 0, v), [(3, 4), ()]),
    # the in-place forms, on a non-leaf so the graph runs through them
    ("scatter_", lambda m, x, s, i: (x * 1).scatter_(0, i, s), [(3, 4), (2, 4), IDX_ROWS]),
    ("scatter_add_", lambda m, x, s, i: (x * 1).scatter_add_(0, i, s), [(3, 4), (2, 4), IDX_ROWS]),
    ("index_add_", lambda m, x, s, i: (x * 2).index_add_(0, i, s), [(3, 4), (3, 4), VEC]),
    ("index_fill_", lambda m, x, i: (x * 2).index_fill_(1, i, 3.0), [(3, 4), VEC]),
    ("index_copy_", lambda m, x, s, i: (x + 1).index_copy_(0, i, s), [(3, 4), (2, 4), UNIQUE]),
    ("masked_fill_", lambda m, x: (x * 1).masked_fill_(x > 0, -2.0), [(3, 4)]),
    ("inplace_on_view", lambda m, x, s, i: (lambda h: (h[1:].index_add_(0, i[:1], s[:1]), h)[-1])(
        x * 3), [(3, 4), (3, 4), np.array([1])]),
]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_values_and_gradients(case):
    _, fn, shapes, *torch_fn = case
    check_op(fn, shapes, *torch_fn)


def test_scatter_reduce_argument():
    x = distgrad.ones(3)
    idx = distgrad.tensor([0, 0, 2])
    assert x.scatter(0, idx, 2.0, reduce="multiply").tolist() == [4.0, 1.0, 2.0]  # repeats too
    with pytest.warns(UserWarning, match="The reduce argument of torch.scatter with Tensor src"):
        out = x.scatter(0, idx, distgrad.tensor([1.0, 2.0, 3.0]), reduce="add")
    assert out.tolist() == [4.0, 1.0, 4.0]
    with pytest.raises(RuntimeError, match="reduce argument must be either add or multiply"):
        x.scatter(0, idx, 1.0, reduce="mean")
    # as in PyTorch, no derivative: the error comes at backward
    y = distgrad.ones(3, requires_grad=True)
    with pytest.raises(RuntimeError, match="derivative for aten::scatter is not implemented"):
        y.scatter(0, idx, 2.0, reduce="add").sum().backward()


def test_grad_fn_names_match_torch():
    x = distgrad.zeros(3, requires_grad=True)
    i = distgrad.tensor([0])
    names = [type(f).__name__ for f in (
        x.scatter(0, i, 1.0).grad_fn, x.scatter(0, i, distgrad.ones(1)).grad_fn,
        x.scatter_add(0, i, distgrad.ones(1)).grad_fn, x.index_add(0, i, distgrad.ones(1)).grad_fn,
        x.index_fill(0, i, 1.0).grad_fn, x.index_copy(0, i, distgrad.ones(1)).grad_fn)]
    assert names == ["ScatterBackward1", "ScatterBackward0", "ScatterAddBackward0",
                     "IndexAddBackward0", "IndexFillBackward0", "IndexCopyBackward0"]


def test_inplace_forms_bump_version_and_refuse_leaves():
    x = distgrad.zeros(3, 4)
    v = x.scatter_(0, distgrad.tensor([[0, 1, 2, 0]]), 1.0)
    assert v is x and x._version == 1
    x.index_add_(1, distgrad.tensor([0]), distgrad.ones(3, 1))
    assert x._version == 2 and x[:, 0].tolist() == [2.0, 1.0, 1.0]
    w = distgrad.zeros(3, requires_grad=True)
    with pytest.raises(RuntimeError, match="a leaf Variable that requires grad"):
        w.index_fill_(0, distgrad.tensor([0]), 1.0)
    h = w * 2
    z = (h * h).sum()  # saves h
    h.scatter_(0, distgrad.tensor([0]), 5.0)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        z.backward()


ERRORS = [
    (lambda m: m.zeros(3, 4).scatter(0, m.tensor([0, 1]), m.ones(3, 4)), RuntimeError,
     "Index tensor must have the same number of dimensions as self tensor"),
    (lambda m: m.zeros(3, 4).scatter(0, m.tensor([[0.0, 1.0]]), m.ones(3, 4)), RuntimeError,
     r"scatter\(\): Expected dtype int32/int64 for index"),
    (lambda m: m.zeros(3, 4).scatter(0, m.tensor([[0, 5]]), m.ones(3, 4)), RuntimeError,
     "index 5 is out of bounds for dimension 0 with size 3"),
    (lambda m: m.zeros(3, 4).scatter(0, m.tensor([[0, -1]]), 1.0), RuntimeError,
     "index -1 is out of bounds for dimension 0 with size 3"),
    (lambda m: m.zeros(3, 4).scatter(0, m.tensor([[0, 1, 1, 1, 1]]), m.ones(3, 4)), RuntimeError,
     r"Expected index \[1, 5\] to be no larger than self \[3, 4\] apart from dimension 0"),
    (lambda m: m.zeros(3, 4).scatter(0, m.tensor([[0, 1, 1]]), m.ones(1, 2)), RuntimeError,
     r"to be no larger size than src \[1, 2\]"),
    (lambda m: m.zeros(3, 4).scatter(0, m.tensor([[0, 1]]), m.ones(2, 4, dtype=m.float64)),
     RuntimeError, r"scatter\(\): Expected self.dtype to be equal to src.dtype"),
    (lambda m: m.zeros(3, 4).scatter(2, m.tensor([[0, 1]]), 1.0), IndexError,
     "Dimension out of range"),
    (lambda m: m.zeros(3, 4).scatter_add(0, m.tensor([[0, 1]]), 5.0), TypeError,
     r"scatter_add\(\): argument 'src' \(position 3\) must be Tensor, not float"),
    (lambda m: m.zeros(3, 4).index_add(0, m.tensor([0, 1]), m.ones(3, 4)), RuntimeError,
     r"index_add_\(\): Number of indices \(2\) should be equal to source.size\(dim\): \(3\), "
     r"for dim: 0"),
    (lambda m: m.zeros(3, 4).index_add(0, m.tensor([0, 7]), m.ones(2, 4)), RuntimeError,
     "index 7 is out of bounds for dimension 0 with size 3"),
    (lambda m: m.zeros(3, 4).index_add(0, m.tensor([[0, 1]]), m.ones(2, 4)), IndexError,
     r"index_add_\(\): Index is supposed to be a vector, but got dim: 2"),
    (lambda m: m.zeros(3, 4).index_add(0, m.tensor([0.0, 1.0]), m.ones(2, 4)), RuntimeError,
     r"index_add_\(\): Expected dtype int32/int64 for index but got: Float"),
    (lambda m: m.zeros(3, 4).index_add(0, m.tensor([0, 1]), m.ones(2, 3)), RuntimeError,
     "source tensor shape must match self tensor shape, excluding the specified dimension"),
    (lambda m: m.zeros(3, 4).index_add(0, m.tensor([0, 1]), m.ones(2, 4, dtype=m.float64)),
     RuntimeError, r"index_add_\(\): self \(Float\) and source \(Double\) must have the same "
                   "scalar type"),
    (lambda m: m.zeros(3, 4).index_fill(0, m.tensor([0, 7]), 1.0), IndexError,
     "index 7 is out of bounds for dimension 0 with size 3"),
    (lambda m: m.zeros(3, 4).index_fill(0, m.tensor([0, 1]), m.tensor([1.0, 2.0])), RuntimeError,
     "index_fill_ only supports a 0-dimensional value tensor, but got tensor with 1 dimension"),
    (lambda m: m.zeros(3, 4).index_fill(0, m.tensor([[0, 1]]), 1.0), RuntimeError,
     "Index has to be a vector/scalar"),
    (lambda m: m.zeros(3, 4).index_fill(0, m.tensor([0.0, 1.0]), 1.0), IndexError,
     r"index_fill_\(\): Expected dtype int64 for index."),
    (lambda m: m.zeros(3, 4).index_copy(0, m.tensor([0, 1]), m.ones(3, 4)), IndexError,
     r"index_copy_\(\): Number of indices \(2\) should be equal to source.size\(dim\) \(3\)"),
    (lambda m: m.zeros(3, 4).index_copy(0, m.tensor([5]), m.ones(1, 4)), IndexError,
     r"index_copy_\(\): index 5 is out of bounds for dimension 0 with size 3"),
    (lambda m: m.zeros(3, 4).index_copy(0, m.tensor([0, 1]), m.ones(2, 4, dtype=m.float64)),
     RuntimeError, r"index_copy_\(\): self and source expected to have the same dtype, but got "
                   r"\(self\) Float and \(source\) Double"),
    (lambda m: m.zeros(3, 4).index_copy(0, m.tensor([0.0]), m.ones(1, 4)), RuntimeError,
     r"index_copy_\(\): Expected a long tensor for index, but got Float"),
]


@pytest.mark.parametrize("make,error,message", ERRORS)
def test_errors_match_torch(make, error, message):
    with pytest.raises(error, match=message):
        make(distgrad)
    if torch is not None:
        with pytest.raises(error, match=message):
            make(torch)

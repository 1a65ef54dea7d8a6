"""The Tensor's own API: attributes, conversion, requires_grad rules, detach, retain_grad."""
import copy

import numpy as np
import pytest

import distgrad
from distgrad.testing.oracle import torch


def test_attributes():
    x = distgrad.zeros(2, 3)
    assert x.shape == (2, 3) and x.size() == (2, 3) and x.size(1) == 3 and x.size(-1) == 3
    assert repr(x.shape) == "distgrad.Size([2, 3])"
    assert x.ndim == 2 and x.dim() == 2 and x.numel() == 6
    assert x.dtype is distgrad.float32 and x.is_floating_point() and not x.is_complex()
    assert x.T.shape == (3, 2) and x.t().shape == (3, 2)
    assert x.is_leaf and x.grad_fn is None and not x.requires_grad
    assert x._version == 0 and not x.is_inference()
    assert x.device == distgrad.device("cpu") and str(x.device) == "cpu"


def test_conversions():
    x = distgrad.tensor([[1.5, 2.0]])
    assert x.tolist() == [[1.5, 2.0]]
    assert x[0, 0].item() == 1.5 and float(x[0, 1]) == 2.0
    assert isinstance(x.numpy(), np.ndarray)
    w = distgrad.ones(1, requires_grad=True)
    with pytest.raises(RuntimeError, match="Use tensor.detach"):
        w.numpy()
    with pytest.raises(RuntimeError, match="cannot be converted to Scalar"):
        x.item()
    with pytest.raises(RuntimeError, match="ambiguous"):
        bool(x)
    assert x.equal(distgrad.tensor([[1.5, 2.0]]))
    assert not x.equal(distgrad.tensor([1.5, 2.0]))


def test_dtype_inference_and_default_dtype():
    assert distgrad.tensor([1, 2]).dtype is distgrad.int64
    assert distgrad.tensor([1.0]).dtype is distgrad.float32
    assert distgrad.tensor([True]).dtype is distgrad.bool
    assert distgrad.tensor([1j]).dtype is distgrad.complex64
    assert distgrad.tensor(np.zeros(2)).dtype is distgrad.float64
    assert distgrad.get_default_dtype() is distgrad.float32
    distgrad.set_default_dtype(distgrad.float64)
    try:
        assert distgrad.tensor([1.0]).dtype is distgrad.float64
        assert distgrad.zeros(1).dtype is distgrad.float64
        assert distgrad.tensor([1j]).dtype is distgrad.complex128
    finally:
        distgrad.set_default_dtype(distgrad.float32)
    with pytest.raises(TypeError):
        distgrad.set_default_dtype(distgrad.int64)


def test_requires_grad_rules():
    with pytest.raises(RuntimeError, match="only Tensors of floating point and complex dtype"):
        distgrad.tensor([1, 2], requires_grad=True)
    x = distgrad.ones(2, requires_grad=True)
    y = x * 2
    with pytest.raises(RuntimeError, match="you can only change requires_grad flags of leaf"):
        y.requires_grad = False
    z = distgrad.ones(2)
    z.requires_grad_()
    assert z.requires_grad and z.is_leaf


def test_detach_shares_storage_and_cuts_graph():
    x = distgrad.ones(2, requires_grad=True)
    y = x * 2
    d = y.detach()
    assert not d.requires_grad and d.grad_fn is None
    d.add_(1)
    assert y.tolist() == [3.0, 3.0]
    y2 = x * 2
    y2.detach_()
    assert y2.is_leaf and not y2.requires_grad


def test_retain_grad_on_non_leaf():
    x = distgrad.ones(2, requires_grad=True)
    h = x * 3
    h.retain_grad()
    assert h.retains_grad and not x.retains_grad
    (h * h).sum().backward()
    assert h.grad.tolist() == [6.0, 6.0]


def test_grad_setter_checks_shape_and_dtype():
    x = distgrad.ones(2, requires_grad=True)
    with pytest.raises(RuntimeError, match="assigned grad has data of a different size"):
        x.grad = distgrad.ones(3)
    with pytest.raises(RuntimeError, match="different type"):
        x.grad = distgrad.ones(2, dtype=distgrad.float64)
    x.grad = distgrad.zeros(2)
    del x.grad
    assert x.grad is None


def test_deepcopy_of_leaf_and_refusal_for_non_leaf():
    x = distgrad.ones(2, requires_grad=True)
    x.grad = distgrad.ones(2)
    c = copy.deepcopy(x)
    assert c is not x and c.requires_grad and c.grad.tolist() == [1.0, 1.0]
    with pytest.raises(RuntimeError, match="graph leaves"):
        copy.deepcopy(x * 2)


def test_repr_looks_like_pytorch():
    assert repr(distgrad.tensor([1.0, 2.0])) == "tensor([1., 2.])"
    assert repr(distgrad.ones(1, requires_grad=True)) == "tensor([1.], requires_grad=True)"
    assert "grad_fn=<MulBackward0>" in repr(distgrad.ones(1, requires_grad=True) * 2)
    assert "dtype=distgrad.float64" in repr(distgrad.ones(1, dtype=distgrad.float64))


def test_tensors_hash_by_identity():
    a, b = distgrad.ones(1), distgrad.ones(1)
    d = {a: 1, b: 2}
    assert d[a] == 1 and d[b] == 2


def test_methods_and_functions_share_names_with_torch():
    names = ["exp", "log", "sum", "mean", "var", "std", "max", "min", "amax", "amin", "prod",
             "logsumexp", "matmul", "reshape", "view", "transpose", "permute", "squeeze",
             "unsqueeze", "expand", "flatten", "index_select", "gather", "split", "chunk",
             "softmax", "log_softmax", "conj", "angle", "clamp", "where", "sigmoid", "tanh",
             "relu", "abs", "neg", "pow", "sqrt", "rsqrt", "sin", "cos", "add", "sub", "mul",
             "div", "maximum", "minimum"]
    for name in names:
        assert hasattr(distgrad.Tensor, name), name
    for name in ["exp", "cat", "stack", "mul", "softmax", "log_softmax", "where", "maximum",
                 "matmul", "logsumexp", "split", "chunk", "real", "imag", "conj", "angle"]:
        assert hasattr(distgrad, name), name
    if torch is not None:
        for name in names:
            assert hasattr(torch.Tensor, name), name


def test_zero_dim_results_are_arrays():
    a, b = distgrad.tensor(2.0), distgrad.tensor(3.0)
    for t in (a / b, a * b, -a, a.exp(), a > b, distgrad.maximum(a, b)):
        assert isinstance(t.numpy(), np.ndarray) and t.shape == ()
    c = a * b
    c.add_(1)
    assert c.item() == 7.0 and c._version == 1

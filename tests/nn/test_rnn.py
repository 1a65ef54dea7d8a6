"""RNN, LSTM, GRU and their cells against PyTorch: values, gradients, parameters, errors."""
import math

import numpy as np
import pytest

import distgrad
from distgrad import nn
from distgrad.autograd import gradcheck, gradgradcheck
from distgrad.ops.rnn import rnn_layer
from distgrad.testing.oracle import torch
from layer_pairs import TOL, assert_pairs_close, module_pair, run_both

pytestmark = pytest.mark.timeout(90)
needs_torch = pytest.mark.skipif(torch is None, reason="torch not installed")

RNN_CASES = [
    ("lstm", lambda m: m.LSTM(3, 4), (5, 2, 3), []),
    ("lstm-2layer-bi-hx", lambda m: m.LSTM(3, 4, 2, bidirectional=True), (4, 2, 3),
     [(4, 2, 4), (4, 2, 4)]),
    ("lstm-proj-bf-nobias", lambda m: m.LSTM(3, 5, 2, bias=False, batch_first=True, proj_size=2,
                                             bidirectional=True),
     (2, 4, 3), [(4, 2, 2), (4, 2, 5)]),
    ("lstm-unbatched", lambda m: m.LSTM(3, 4, 2), (5, 3), [(2, 4), (2, 4)]),
    ("gru-2layer-bi", lambda m: m.GRU(3, 4, 2, bidirectional=True), (4, 2, 3), [(4, 2, 4)]),
    ("gru-bf-nobias", lambda m: m.GRU(3, 4, bias=False, batch_first=True), (2, 5, 3), []),
    ("gru-unbatched-bf", lambda m: m.GRU(3, 4, batch_first=True), (5, 3), [(1, 4)]),
    ("rnn-tanh-bi", lambda m: m.RNN(3, 4, 2, bidirectional=True), (4, 2, 3), [(4, 2, 4)]),
    ("rnn-relu-bf", lambda m: m.RNN(3, 4, 2, "relu", batch_first=True), (2, 5, 3), [(2, 2, 4)]),
    ("rnn-unbatched", lambda m: m.RNN(3, 4, nonlinearity="relu", bias=False), (5, 3), []),
    ("lstmcell", lambda m: m.LSTMCell(3, 4), (2, 3), [(2, 4), (2, 4)]),
    ("lstmcell-no-state", lambda m: m.LSTMCell(3, 4, bias=False), (2, 3), []),
    ("grucell", lambda m: m.GRUCell(3, 4), (2, 3), [(2, 4)]),
    ("grucell-unbatched", lambda m: m.GRUCell(3, 4), (3,), [(4,)]),
    ("rnncell-relu", lambda m: m.RNNCell(3, 4, nonlinearity="relu"), (2, 3), [(2, 4)]),
    ("rnncell-unbatched", lambda m: m.RNNCell(3, 4), (3,), []),
]


@needs_torch
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("name,build,shape,states", RNN_CASES, ids=[c[0] for c in RNN_CASES])
def test_recurrent_matches_torch(name, build, shape, states, dtype):
    assert_pairs_close(run_both(build, [shape] + states, dtype, group=_with_state), dtype)


def _with_state(tensors):
    """(input,), (input, h0) or (input, (h0, c0)): the call forms of the recurrent layers."""
    if len(tensors) <= 2:
        return tensors
    return [tensors[0], tuple(tensors[1:])]


@needs_torch
@pytest.mark.parametrize("cls", ["LSTM", "GRU", "RNN"])
def test_dropout_between_layers_and_eval(cls):
    """dropout=1 zeroes every layer's input but the first's: deterministic, so comparable."""
    build = lambda m: getattr(m, cls)(3, 4, 3, dropout=1.0)  # noqa: E731
    assert_pairs_close(run_both(build, [(4, 2, 3)], np.float64), np.float64)
    ours, theirs = module_pair(build, np.float32)
    ours.eval()
    theirs.eval()
    x = np.random.default_rng(0).standard_normal((4, 2, 3)).astype(np.float32)
    np.testing.assert_allclose(ours(distgrad.tensor(x))[0].detach().numpy(),
                               theirs(torch.tensor(x))[0].detach().numpy(), **TOL[np.float32])


@needs_torch
@pytest.mark.parametrize("build", [
    lambda m: m.LSTM(10, 20, 2, bidirectional=True, proj_size=5),
    lambda m: m.LSTM(3, 4, bias=False, batch_first=True, dropout=0.0),
    lambda m: m.GRU(3, 4, 3, dropout=0.25),
    lambda m: m.RNN(3, 4, 2, "relu", bidirectional=True),
    lambda m: m.LSTMCell(3, 4), lambda m: m.GRUCell(3, 4, bias=False),
    lambda m: m.RNNCell(3, 4, nonlinearity="relu"),
])
def test_parameters_state_dict_and_repr(build):
    ours, theirs = build(nn), build(torch.nn)
    assert list(ours.state_dict()) == list(theirs.state_dict())
    assert [(n, tuple(p.shape)) for n, p in ours.named_parameters()] == \
        [(n, tuple(p.shape)) for n, p in theirs.named_parameters()]
    assert repr(ours) == repr(theirs)
    if hasattr(theirs, "_flat_weights_names"):
        assert ours._flat_weights_names == theirs._flat_weights_names
        assert [[tuple(p.shape) for p in layer] for layer in ours.all_weights] == \
            [[tuple(p.shape) for p in layer] for layer in theirs.all_weights]


def test_default_init_bounds():
    distgrad.manual_seed(0)
    lstm = nn.LSTM(30, 50, 2)
    bound = 1 / math.sqrt(50)  # uniform(-1/sqrt(hidden_size), +1/sqrt(hidden_size)), every tensor
    for name, p in lstm.named_parameters():
        v = p.detach().numpy()
        assert np.abs(v).max() <= bound, name
        assert np.abs(v).max() > 0.9 * bound, name
    cell = nn.GRUCell(4, 25)
    assert np.abs(cell.weight_hh.detach().numpy()).max() <= 1 / 5
    assert nn.RNN(2, 3, dtype=distgrad.float64).weight_ih_l0.dtype == distgrad.float64


def test_one_fused_node_per_layer_and_direction():
    x = distgrad.randn(6, 2, 3, requires_grad=True)
    out, (h, c) = nn.LSTM(3, 4)(x)
    assert type(out.grad_fn).__name__ == "LSTMLayerBackward0"
    assert out.grad_fn is h.grad_fn.next_functions[0][0]  # h_n is stacked from the same node
    out, h = nn.GRU(3, 4)(x)
    assert type(out.grad_fn).__name__ == "GRULayerBackward0"
    assert type(nn.RNN(3, 4)(x)[0].grad_fn).__name__ == "RNNTanhLayerBackward0"
    with distgrad.no_grad():
        out, _ = nn.LSTM(3, 4)(x)
    assert out.grad_fn is None and not out.requires_grad


def test_outputs_are_not_aliased_with_saved_state():
    lstm = nn.LSTM(2, 3)
    x = distgrad.randn(4, 1, 2, requires_grad=True)
    out, (h, c) = lstm(x)
    out.sum().backward(retain_graph=True)
    first = [p.grad.numpy().copy() for p in lstm.parameters()]
    with distgrad.no_grad():
        h.mul_(0)  # the caller's copy; backward must not read it
    lstm.zero_grad()
    out.sum().backward()
    for a, p in zip(first, lstm.parameters()):
        np.testing.assert_allclose(p.grad.numpy(), a)


def _small(shape, seed):
    return distgrad.tensor(np.random.default_rng(seed).standard_normal(shape) * 0.7,
                           requires_grad=True)


@pytest.mark.parametrize("mode,reverse,proj", [("LSTM", False, False), ("LSTM", True, True),
                                               ("GRU", True, False), ("RNN_TANH", False, False),
                                               ("RNN_RELU", True, False)])
def test_fused_layer_gradcheck(mode, reverse, proj):
    gates = {"LSTM": 4, "GRU": 3}.get(mode, 1)
    hidden, out_size = 3, (2 if proj else 3)
    tensors = [_small((3, 2, 2), 0), _small((2, out_size), 1),
               _small((2, hidden), 2) if mode == "LSTM" else None,
               _small((gates * hidden, 2), 3), _small((gates * hidden, out_size), 4),
               _small((gates * hidden,), 5), _small((gates * hidden,), 6),
               _small((out_size, hidden), 7) if proj else None]
    present = [t for t in tensors if t is not None]

    def fn(*args):
        it = iter(args)
        full = [next(it) if t is not None else None for t in tensors]
        return tuple(rnn_layer(mode, *full, reverse=reverse))
    assert gradcheck(fn, tuple(present))


@pytest.mark.parametrize("mode", ["LSTM", "GRU"])
def test_fused_layer_gradgradcheck(mode):
    """Second order differentiates the step-by-step reference of the same layer."""
    gates = 4 if mode == "LSTM" else 3
    x, h0 = _small((2, 1, 1), 0), _small((1, 1), 1)
    c0 = _small((1, 1), 2) if mode == "LSTM" else None
    w_ih, w_hh, b = _small((gates, 1), 3), _small((gates, 1), 4), _small((gates,), 5)
    args = (x, h0, w_ih, w_hh, b) + ((c0,) if c0 is not None else ())

    def fn(x, h0, w_ih, w_hh, b, c0=None):
        return tuple(rnn_layer(mode, x, h0, c0, w_ih, w_hh, b, None, reverse=True))
    assert gradgradcheck(fn, args)


@needs_torch
def test_double_backward_matches_torch():
    def penalty(lib, model, x):
        out, _ = model(x)
        (gx,) = lib.autograd.grad((out * out).sum(), x, create_graph=True)
        return (gx * gx).sum()

    ours, theirs = module_pair(lambda m: m.LSTM(2, 3, 2, bidirectional=True), np.float64)
    data = np.random.default_rng(1).standard_normal((3, 2, 2))
    x, tx = distgrad.tensor(data, requires_grad=True), torch.tensor(data, requires_grad=True)
    p, tp = penalty(distgrad, ours, x), penalty(torch, theirs, tx)
    np.testing.assert_allclose(p.item(), tp.item(), rtol=1e-10)
    p.backward()
    tp.backward()
    for a, b in zip(ours.parameters(), theirs.parameters()):
        np.testing.assert_allclose(a.grad.numpy(), b.grad.numpy(), rtol=1e-7, atol=1e-10)
    np.testing.assert_allclose(x.grad.numpy(), tx.grad.numpy(), rtol=1e-7, atol=1e-10)


class _PackedLike:  # what torch.nn.utils.rnn.pack_padded_sequence returns, as far as we look
    batch_sizes = None


@pytest.mark.parametrize("call,exc,match", [
    (lambda: nn.RNN(3, 4)(distgrad.randn(5, 2, 3, 1)), ValueError,
     "RNN: Expected input to be 2D or 3D, got 4D tensor instead"),
    (lambda: nn.LSTM(3, 4)(distgrad.randn(5)), ValueError,
     "LSTM: Expected input to be 2D or 3D, got 1D instead"),
    (lambda: nn.LSTM(3, 4)(distgrad.randn(5, 2, 6)), RuntimeError,
     "input.size\\(-1\\) must be equal to input_size. Expected 3, got 6"),
    (lambda: nn.LSTM(3, 4)(distgrad.randn(5, 2, 3, dtype=distgrad.float64)), ValueError,
     "RNN input dtype"),
    (lambda: nn.GRU(3, 4)(distgrad.randn(5, 2, 3), distgrad.randn(1, 3, 4)), RuntimeError,
     "Expected hidden size \\(1, 2, 4\\), got \\[1, 3, 4\\]"),
    (lambda: nn.LSTM(3, 4)(distgrad.randn(5, 2, 3), (distgrad.randn(1, 2, 4),
                                                     distgrad.randn(1, 3, 4))), RuntimeError,
     "Expected hidden\\[1\\] size \\(1, 2, 4\\), got \\[1, 3, 4\\]"),
    (lambda: nn.GRU(3, 4)(distgrad.randn(5, 3), distgrad.randn(1, 1, 4)), RuntimeError,
     "For unbatched 2-D input, hx should also be 2-D but got 3-D tensor"),
    (lambda: nn.LSTM(3, 4)(distgrad.randn(5, 2, 3), (distgrad.randn(2, 4), distgrad.randn(2, 4))),
     RuntimeError, "hx and cx should also be 3-D"),
    (lambda: nn.LSTM(3, 4)(distgrad.randn(0, 2, 3)), RuntimeError,
     "Expected sequence length to be larger than 0"),
    (lambda: nn.LSTM(3, 4)(_PackedLike()), NotImplementedError, "PackedSequence"),
    (lambda: nn.RNN(3, 4, nonlinearity="gelu"), ValueError, "Unknown nonlinearity 'gelu'"),
    (lambda: nn.GRU(3, 4, proj_size=2), ValueError,
     "proj_size argument is only supported for LSTM"),
    (lambda: nn.LSTM(3, 4, proj_size=4), ValueError,
     "proj_size has to be smaller than hidden_size"),
    (lambda: nn.LSTM(3, 4, 2, dropout=1.5), ValueError, "dropout should be a number in range"),
    (lambda: nn.LSTM(3, 0), ValueError, "hidden_size must be greater than zero"),
    (lambda: nn.LSTM(3, 4.0), TypeError, "hidden_size should be of type int"),
    (lambda: nn.LSTM(3, 4, 0), ValueError, "num_layers must be greater than zero"),
    (lambda: nn.LSTMCell(3, 4)(distgrad.randn(2, 5)), RuntimeError,
     "input has inconsistent input_size: got 5 expected 3"),
    (lambda: nn.LSTMCell(3, 4)(distgrad.randn(2, 3), (distgrad.randn(2, 5), distgrad.randn(2, 4))),
     RuntimeError, "hidden0 has inconsistent hidden_size: got 5, expected 4"),
    (lambda: nn.GRUCell(3, 4)(distgrad.randn(2, 3), distgrad.randn(3, 4)), RuntimeError,
     "Input batch size 2 doesn't match hidden0 batch size 3"),
    (lambda: nn.RNNCell(3, 4)(distgrad.randn(1, 2, 3)), ValueError,
     "RNNCell: Expected input to be 1D or 2D, got 3D instead"),
    (lambda: nn.LSTMCell(3, 4)(distgrad.randn(2, 3), (distgrad.randn(1, 2, 4),
                                                      distgrad.randn(2, 4))), ValueError,
     "LSTMCell: Expected hx\\[0\\] to be 1D or 2D, got 3D instead"),
    (lambda: nn.RNNCell(3, 4, nonlinearity="gelu")(distgrad.randn(2, 3)), RuntimeError,
     "Unknown nonlinearity: gelu"),
    (lambda: nn.RNNCell(3, 4)(distgrad.randn(2, 3, dtype=distgrad.float64)), RuntimeError,
     "mat1 and mat2 must have the same dtype, but got Double and Float"),
])
def test_errors_name_the_fault(call, exc, match):
    with pytest.raises(exc, match=match):
        call()


def test_dropout_warning_like_torch():
    with pytest.warns(UserWarning, match="non-zero dropout expects num_layers greater than 1"):
        nn.LSTM(3, 4, dropout=0.5)

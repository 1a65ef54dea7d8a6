"""Recurrent layers (LSTM, GRU, Elman RNN): one fused node per layer and direction.

Forward projects the inputs of all time steps in one matmul, then runs one matmul
per step for the recurrence, computing every gate of a step at once; it keeps the
gate activations (and cell states) that backward needs. Backward through time is
hand-written NumPy: per step only elementwise work and the recurrent matmul, then
the weight gradients of all steps in one matmul each.

Gate order and formulas are PyTorch's: LSTM (i, f, g, o); GRU (r, z, n) with
``n = tanh(W_in x + b_in + r * (W_hn h + b_hn))`` and ``h' = (1 - z) * n + z * h``.

A gradient of a gradient (``create_graph=True``) differentiates the same layer
written step by step from differentiable ops (:func:`_reference_layer`), which
runs only then.

>>> import distgrad
>>> x, h0, c0 = distgrad.randn(5, 2, 3), distgrad.zeros(2, 4), distgrad.zeros(2, 4)
>>> w_ih, w_hh = distgrad.randn(16, 3), distgrad.randn(16, 4)
>>> out, h_n, c_n = rnn_layer("LSTM", x, h0, c0, w_ih, w_hh)
>>> out.shape
distgrad.Size([5, 2, 4])
"""
import numpy as np

from ..autograd.engine import grad as _autograd_grad
from ..autograd.grad_mode import is_grad_enabled
from . import linalg, shape, unary
from .fused import require_floating
from ..autograd._internal import array_of, wrap, defop, record_multi

__all__ = ["rnn_layer", "MODES"]

MODES = ("LSTM", "GRU", "RNN_TANH", "RNN_RELU")


def _sigmoid_(a):
    """Logistic sigmoid in place, in its tanh form (no overflow for large |a|)."""
    a *= 0.5
    np.tanh(a, out=a)
    a *= 0.5
    a += 0.5
    return a


def _steps(length, reverse):
    return range(length - 1, -1, -1) if reverse else range(length)


def _previous(states, initial, reverse):
    """The state each step started from, per step: (T, B, size)."""
    if reverse:
        return np.concatenate([states[1:], initial[None]])
    return np.concatenate([initial[None], states[:-1]])


def _projection(x, w, *biases):
    """``x @ w.T + biases`` for all time steps in one matmul: (T, B, rows of w)."""
    t, b = x.shape[:2]
    out = np.matmul(x.reshape(t * b, -1), w.T).reshape(t, b, -1)
    for bias in biases:
        if bias is not None:
            out += bias
    return out


def _affine_grads(d, inputs, weight, need_inputs, need_weight, need_bias):
    """Gradients of ``inputs @ weight.T + bias`` over all steps, given d (T, B, rows)."""
    rows = d.reshape(-1, d.shape[-1])
    return (np.matmul(rows, weight).reshape(inputs.shape) if need_inputs else None,
            np.matmul(rows.T, inputs.reshape(-1, inputs.shape[-1])) if need_weight else None,
            rows.sum(0) if need_bias else None)


def _add_output_grad(dh, d_out, t):
    return dh if d_out is None else dh + d_out[t]


# ---------------------------------------------------------------- LSTM
def _lstm_forward(x, h0, c0, w_ih, w_hh, b_ih, b_hh, w_hr, reverse):
    t_len, batch = x.shape[:2]
    hidden = c0.shape[1]
    gates = _projection(x, w_ih, b_ih, b_hh)  # becomes the activated gates, step by step
    cells = np.empty((t_len, batch, hidden), dtype=x.dtype)
    tanh_cells = np.empty_like(cells)
    hs = np.empty((t_len, batch, h0.shape[1]), dtype=x.dtype)
    h, c = h0, c0
    w_hh_t = w_hh.T
    sig_if, g_, o_ = slice(0, 2 * hidden), slice(2 * hidden, 3 * hidden), slice(3 * hidden, None)
    for t in _steps(t_len, reverse):
        a = gates[t]
        a += np.matmul(h, w_hh_t)
        _sigmoid_(a[:, sig_if])
        np.tanh(a[:, g_], out=a[:, g_])
        _sigmoid_(a[:, o_])
        c = np.multiply(a[:, hidden:2 * hidden], c, out=cells[t])
        c += a[:, :hidden] * a[:, g_]
        tc = np.tanh(c, out=tanh_cells[t])
        if w_hr is None:
            h = np.multiply(a[:, o_], tc, out=hs[t])
        else:
            h = np.matmul(a[:, o_] * tc, w_hr.T, out=hs[t])
    return (hs, h, c), (gates, cells, tanh_cells)


def _lstm_backward(d_out, dh, dc, inputs, acts, hs, reverse, needs):
    x, h0, c0, w_ih, w_hh, _, _, w_hr = inputs
    gates, cells, tanh_cells = acts
    hidden = c0.shape[1]
    d_gates = np.empty_like(gates)
    dh = np.zeros_like(h0) if dh is None else dh
    dc = np.zeros_like(c0) if dc is None else dc.copy()
    d_hs = np.empty_like(hs) if w_hr is not None else None
    c_prev_all = _previous(cells, c0, reverse)
    for t in reversed(_steps(x.shape[0], reverse)):
        dh = _add_output_grad(dh, d_out, t)
        if w_hr is not None:
            d_hs[t] = dh
            dh = np.matmul(dh, w_hr)
        a, tc, dg = gates[t], tanh_cells[t], d_gates[t]
        i, f, g, o = (a[:, k * hidden:(k + 1) * hidden] for k in range(4))
        dc += dh * o * (1 - tc * tc)
        dg[:, 3 * hidden:] = dh * tc * o * (1 - o)
        dg[:, :hidden] = dc * g * i * (1 - i)
        dg[:, hidden:2 * hidden] = dc * c_prev_all[t] * f * (1 - f)
        dg[:, 2 * hidden:3 * hidden] = dc * i * (1 - g * g)
        dc *= f
        dh = np.matmul(dg, w_hh)
    dx, dw_ih, db = _affine_grads(d_gates, x, w_ih, needs[0], needs[3], needs[5] or needs[6])
    _, dw_hh, _ = _affine_grads(d_gates, _previous(hs, h0, reverse), w_hh, False, needs[4], False)
    dw_hr = None
    if needs[7]:
        raw = gates[..., 3 * hidden:] * tanh_cells  # the hidden state before projection
        dw_hr = _affine_grads(d_hs, raw, w_hr, False, True, False)[1]
    return dx, dh, dc, dw_ih, dw_hh, db, db, dw_hr


# ---------------------------------------------------------------- GRU
def _gru_forward(x, h0, c0, w_ih, w_hh, b_ih, b_hh, w_hr, reverse):
    t_len, batch = x.shape[:2]
    hidden = h0.shape[1]
    gates = _projection(x, w_ih, b_ih)  # becomes (r, z, n), step by step
    n_hidden = np.empty((t_len, batch, hidden), dtype=x.dtype)  # W_hn h + b_hn, per step
    hs = np.empty((t_len, batch, hidden), dtype=x.dtype)
    h = h0
    w_hh_t = w_hh.T
    rz, n_ = slice(0, 2 * hidden), slice(2 * hidden, None)
    for t in _steps(t_len, reverse):
        gh = np.matmul(h, w_hh_t)
        if b_hh is not None:
            gh += b_hh
        a = gates[t]
        a[:, rz] += gh[:, rz]
        _sigmoid_(a[:, rz])
        n_hidden[t] = gh[:, n_]
        n = a[:, n_]
        n += a[:, :hidden] * n_hidden[t]
        np.tanh(n, out=n)
        h = np.subtract(h, n, out=hs[t])  # h' = n + z * (h - n)
        h *= a[:, hidden:2 * hidden]
        h += n
    return (hs, h), (gates, n_hidden)


def _gru_backward(d_out, dh, dc, inputs, acts, hs, reverse, needs):
    x, h0, _, w_ih, w_hh, _, _, _ = inputs
    gates, n_hidden = acts
    hidden = h0.shape[1]
    d_hidden_gates = np.empty_like(gates)   # w.r.t. W_hh h + b_hh
    d_input_n = np.empty_like(n_hidden)     # the n part w.r.t. W_ih x + b_ih
    dh = np.zeros_like(h0) if dh is None else dh
    h_prev_all = _previous(hs, h0, reverse)
    for t in reversed(_steps(x.shape[0], reverse)):
        dh = _add_output_grad(dh, d_out, t)
        a, dg = gates[t], d_hidden_gates[t]
        r, z, n = (a[:, k * hidden:(k + 1) * hidden] for k in range(3))
        dn = np.multiply(dh * (1 - z), 1 - n * n, out=d_input_n[t])
        dg[:, hidden:2 * hidden] = dh * (h_prev_all[t] - n) * z * (1 - z)
        dg[:, :hidden] = dn * n_hidden[t] * r * (1 - r)
        dg[:, 2 * hidden:] = dn * r
        dh = dh * z + np.matmul(dg, w_hh)
    d_input_gates = d_hidden_gates.copy()
    d_input_gates[..., 2 * hidden:] = d_input_n
    dx, dw_ih, db_ih = _affine_grads(d_input_gates, x, w_ih, needs[0], needs[3], needs[5])
    _, dw_hh, db_hh = _affine_grads(d_hidden_gates, h_prev_all, w_hh, False, needs[4], needs[6])
    return dx, dh, None, dw_ih, dw_hh, db_ih, db_hh, None


# ---------------------------------------------------------------- Elman RNN (tanh, relu)
def _elman_forward(relu):
    def forward(x, h0, c0, w_ih, w_hh, b_ih, b_hh, w_hr, reverse):
        hs = _projection(x, w_ih, b_ih, b_hh)  # becomes the hidden states, step by step
        h = h0
        w_hh_t = w_hh.T
        for t in _steps(x.shape[0], reverse):
            pre = hs[t]
            pre += np.matmul(h, w_hh_t)
            h = np.maximum(pre, 0, out=pre) if relu else np.tanh(pre, out=pre)
        return (hs, h), ()
    return forward


def _elman_backward(relu):
    def backward(d_out, dh, dc, inputs, acts, hs, reverse, needs):
        x, h0, _, w_ih, w_hh, _, _, _ = inputs
        d_pre = np.empty_like(hs)
        dh = np.zeros_like(h0) if dh is None else dh
        for t in reversed(_steps(x.shape[0], reverse)):
            dh = _add_output_grad(dh, d_out, t)
            h = hs[t]
            np.multiply(dh, (h > 0) if relu else 1 - h * h, out=d_pre[t])
            dh = np.matmul(d_pre[t], w_hh)
        dx, dw_ih, db = _affine_grads(d_pre, x, w_ih, needs[0], needs[3], needs[5] or needs[6])
        _, dw_hh, _ = _affine_grads(d_pre, _previous(hs, h0, reverse), w_hh, False, needs[4], False)
        return dx, dh, None, dw_ih, dw_hh, db, db, None
    return backward


_KERNELS = {"LSTM": (_lstm_forward, _lstm_backward),
            "GRU": (_gru_forward, _gru_backward),
            "RNN_TANH": (_elman_forward(False), _elman_backward(False)),
            "RNN_RELU": (_elman_forward(True), _elman_backward(True))}


# ---------------------------------------------------------------- the reference, for higher order
def _reference_layer(mode, reverse, x, h0, c0, w_ih, w_hh, b_ih, b_hh, w_hr):
    """The layer from differentiable ops, one step at a time: what second order differentiates."""
    outs = [None] * x.shape[0]
    h, c = h0, c0
    for t in _steps(x.shape[0], reverse):
        gi = linalg.linear(x[t], w_ih, b_ih)
        gh = linalg.linear(h, w_hh, b_hh)
        if mode == "LSTM":
            i, f, g, o = shape.chunk(gi + gh, 4, 1)
            c = unary.sigmoid(f) * c + unary.sigmoid(i) * unary.tanh(g)
            h = unary.sigmoid(o) * unary.tanh(c)
            if w_hr is not None:
                h = linalg.linear(h, w_hr)
        elif mode == "GRU":
            ir, iz, i_n = shape.chunk(gi, 3, 1)
            hr, hz, h_n = shape.chunk(gh, 3, 1)
            r, z = unary.sigmoid(ir + hr), unary.sigmoid(iz + hz)
            n = unary.tanh(i_n + r * h_n)
            h = n + z * (h - n)
        else:
            h = unary.tanh(gi + gh) if mode == "RNN_TANH" else unary.relu(gi + gh)
        outs[t] = h
    return [shape.stack(outs, 0), h] + ([c] if mode == "LSTM" else [])


def _grads_of_reference(m, grads, needs, inputs):
    outs = _reference_layer(m["mode"], m["reverse"], *inputs)
    roots = [(o, g) for o, g in zip(outs, grads) if g is not None]
    wanted = [t for t, need in zip(inputs, needs) if need]
    got = iter(_autograd_grad([o for o, _ in roots], wanted, [g for _, g in roots],
                              create_graph=True, allow_unused=True))
    return tuple(next(got) if need else None for need in needs)


# ---------------------------------------------------------------- the node
def _layer_vjp(xp, grads, m, needs, *saved):
    present = m["present"]
    inputs = [None] * len(present)
    k = 0
    for i, here in enumerate(present):
        if here:
            inputs[i] = saved[k]
            k += 1
    if xp.is_tensor_backend():
        return _grads_of_reference(m, grads, needs, inputs)
    acts, hs = saved[k:-1], saved[-1]
    d_out, dh, dc = (list(grads) + [None])[:3]
    result = _KERNELS[m["mode"]][1](d_out, dh, dc, inputs, acts, hs, m["reverse"], needs)
    return tuple(g if need else None for g, need in zip(result, needs))


_NODES = {mode: defop(name, vjp_all=_layer_vjp) for mode, name in (
    ("LSTM", "LSTMLayerBackward0"), ("GRU", "GRULayerBackward0"),
    ("RNN_TANH", "RNNTanhLayerBackward0"), ("RNN_RELU", "RNNReluLayerBackward0"))}


def rnn_layer(mode, input, hx, cx, w_ih, w_hh, b_ih=None, b_hh=None, w_hr=None, reverse=False):
    """One layer in one direction over a time-major (T, B, features) ``input``.

    Returns ``[output (T, B, H), h_n]``, plus ``c_n`` for ``"LSTM"``. ``reverse``
    runs from the last step to the first (the backward half of a bidirectional
    layer); its output stays aligned with the input's time steps.
    """
    if mode not in MODES:
        raise ValueError(f"Unrecognized RNN mode: {mode}")
    inputs = (input, hx, cx, w_ih, w_hh, b_ih, b_hh, w_hr)
    require_floating(mode.lower(), *inputs)
    if array_of(input).shape[0] == 0:
        raise RuntimeError("Expected sequence length to be larger than 0 in RNN")
    arrays = [None if t is None else array_of(t) for t in inputs]
    (hs, *finals), acts = _KERNELS[mode][0](*arrays, reverse)
    if not (is_grad_enabled() and any(t is not None and t.requires_grad for t in inputs)):
        return [wrap(a) for a in (hs, *finals)]
    saved = [t for t in inputs if t is not None] + [wrap(a) for a in (*acts, hs)]
    # The caller gets copies: changing an output in place must not change what backward reads.
    return record_multi(_NODES[mode], [a.copy() for a in (hs, *finals)], inputs, saved,
                        {"mode": mode, "reverse": reverse,
                         "present": tuple(t is not None for t in inputs)})

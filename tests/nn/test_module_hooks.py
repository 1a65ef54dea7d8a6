"""Module hooks (forward, forward pre, full backward, backward pre, global, deprecated) vs PyTorch."""
import warnings

import numpy as np
import pytest

import distgrad
from distgrad.testing.oracle import torch


def _l(t):
    return None if t is None else [round(v, 4) for v in t.detach().reshape(-1).tolist()]


def _log_backward(module, log):
    module.register_full_backward_hook(
        lambda mod, gi, go: log.append(([_l(g) for g in gi], [_l(g) for g in go])))


def _net(lib):
    m = lib.nn.Sequential(lib.nn.Linear(3, 4), lib.nn.Tanh(), lib.nn.Linear(4, 2))
    values = [np.arange(12, dtype=np.float32).reshape(4, 3) / 10, np.ones(4, np.float32) / 10,
              np.arange(8, dtype=np.float32).reshape(2, 4) / 20 - 0.1, np.zeros(2, np.float32)]
    with lib.no_grad():
        for p, v in zip(m.parameters(), values):
            p.copy_(lib.tensor(v))
    return m


def _input(lib):
    return lib.tensor(np.linspace(-1, 1, 6, dtype=np.float32).reshape(2, 3), requires_grad=True)


def local_and_global_hooks(lib):
    log = []
    m = _net(lib)
    x = _input(lib)
    mm = lib.nn.modules.module
    handles = [
        mm.register_module_full_backward_hook(
            lambda mod, gi, go: log.append(("global_bw", type(mod).__name__, [_l(g) for g in gi],
                                            [_l(g) for g in go]))),
        mm.register_module_full_backward_pre_hook(
            lambda mod, go: log.append(("global_bw_pre", type(mod).__name__))),
        mm.register_module_forward_hook(lambda mod, a, o: log.append(("global_fw", type(mod).__name__))),
        mm.register_module_forward_pre_hook(
            lambda mod, a: log.append(("global_fw_pre", type(mod).__name__))),
    ]
    m[0].register_full_backward_hook(
        lambda mod, gi, go: log.append(("lin0_bw", [_l(g) for g in gi], [_l(g) for g in go])))
    m[2].register_full_backward_pre_hook(
        lambda mod, go: (log.append(("lin2_bw_pre", [_l(g) for g in go])), (go[0] * 2,))[1])
    m[1].register_full_backward_hook(lambda mod, gi, go: (log.append("tanh_bw"), (gi[0] + 1,))[1])
    m[0].register_forward_pre_hook(lambda mod, a: (a[0] * 2,))
    m[2].register_forward_hook(lambda mod, a, o: o * 3)
    m[0].register_forward_pre_hook(lambda mod, a: log.append("prepended"), prepend=True)
    try:
        y = m(x)
        y.sum().backward()
    finally:
        for h in handles:
            h.remove()
    log.append(("x.grad", _l(x.grad)))
    log.append(("w0.grad", _l(m[0].weight.grad)))
    return log


def kwargs_and_non_tensor_inputs(lib):
    log = []

    class M(lib.nn.Module):
        def forward(self, a, k, b, scale=1.0):
            return a * b * scale, k

    m = M()
    m.register_full_backward_hook(
        lambda mod, gi, go: log.append(("bw", [_l(g) for g in gi], [_l(g) for g in go])))
    m.register_forward_pre_hook(lambda mod, a, kw: (a, {"scale": 2.0}), with_kwargs=True)
    m.register_forward_hook(lambda mod, a, kw, o: log.append(("fw_kwargs", kw)), with_kwargs=True)
    a = lib.tensor([1.0, 2.0], requires_grad=True)
    b = lib.tensor([3.0, 4.0])
    out, k = m(a, 7, b, scale=1.0)
    out.sum().backward()
    log.append(("k", k))
    log.append(("a.grad", _l(a.grad)))
    return log


def backward_hook_replaces_grad_input(lib):
    m = lib.nn.Linear(2, 2)
    with lib.no_grad():
        m.weight.copy_(lib.tensor([[1.0, 2.0], [3.0, 4.0]]))
    m.register_full_backward_hook(lambda mod, gi, go: (gi[0] * 0 + 7,))
    x = lib.tensor([[1.0, 1.0]], requires_grad=True)
    m(x).sum().backward()
    return _l(x.grad)


def inplace_on_hooked_module(lib):
    out = []
    relu = lib.nn.ReLU(inplace=True)
    relu.register_full_backward_hook(lambda *a: None)
    x = lib.tensor([1.0, -2.0], requires_grad=True)
    try:
        relu(x * 1)
        out.append("no error")
    except RuntimeError as e:
        out.append(str(e))
    lin = lib.nn.Linear(2, 2)
    lin.register_full_backward_hook(lambda *a: None)
    y = lin(x * 1)
    try:
        y.add_(1)
        out.append("no error")
    except RuntimeError as e:
        out.append(str(e))
    with lib.no_grad():
        y.add_(1)
    lin(x * 1).detach().add_(1)
    out.append("allowed outside autograd")
    return out


def deprecated_backward_hook(lib):
    out = []
    m = lib.nn.Linear(2, 2)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        m.register_backward_hook(lambda mod, gi, go: out.append(("old", len(gi), len(go))))
        m(lib.ones(1, 2, requires_grad=True)).sum().backward()
    out.append(sorted({w.category.__name__ for w in caught}))
    try:
        m.register_full_backward_hook(lambda *a: None)
    except RuntimeError as e:
        out.append(str(e))
    return out


def always_call_hook(lib):
    log = []

    class Bad(lib.nn.Module):
        def forward(self, x):
            raise ValueError("boom")

    m = Bad()
    m.register_forward_hook(lambda mod, a, o: log.append(("always", o)), always_call=True)
    m.register_forward_hook(lambda mod, a, o: log.append("never"))
    try:
        m(lib.ones(1))
    except ValueError as e:
        log.append(str(e))
    return log


def no_input_requires_grad(lib):
    log = []
    m = lib.nn.Linear(2, 2)
    m.register_full_backward_hook(lambda mod, gi, go: log.append(("bw", gi, len(go))))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        m(lib.ones(1, 2)).sum().backward()
    log.append(sorted({w.category.__name__ for w in caught}))
    return log


def hook_removal_and_order(lib):
    log = []
    m = lib.nn.Tanh()
    h1 = m.register_forward_hook(lambda mod, a, o: log.append("first"))
    m.register_forward_hook(lambda mod, a, o: log.append("second"))
    m.register_forward_hook(lambda mod, a, o: log.append("prepended"), prepend=True)
    m.register_full_backward_pre_hook(lambda mod, go: log.append("bw_pre_1"))
    m.register_full_backward_pre_hook(lambda mod, go: log.append("bw_pre_0"), prepend=True)
    x = lib.ones(2, requires_grad=True)
    m(x).sum().backward()
    h1.remove()
    with m.register_forward_pre_hook(lambda mod, a: log.append("ctx")):
        m(x)
    m(x)
    return log


def identity_module(lib):
    log = []
    m = lib.nn.Identity()
    _log_backward(m, log)
    m.register_full_backward_pre_hook(lambda mod, go: log.append("pre"))
    x = lib.tensor([1.0, 2.0], requires_grad=True)
    (m(x) * 3).sum().backward()
    log.append(_l(x.grad))
    return log


def reused_module(lib):
    log = []
    m = lib.nn.Tanh()
    _log_backward(m, log)
    x = lib.tensor([0.5, 1.0], requires_grad=True)
    m(m(x)).sum().backward()
    return log


def tuple_output_partly_used(lib):
    log = []

    class M(lib.nn.Module):
        def forward(self, a, b):
            return a * 2, b * 3, "tag"

    m = M()
    _log_backward(m, log)
    m.register_full_backward_pre_hook(lambda mod, go: log.append(("pre", [_l(g) for g in go])))
    a = lib.tensor([1.0], requires_grad=True)
    b = lib.tensor([1.0], requires_grad=True)
    p, q, t = m(a, b)
    p.sum().backward()
    return log


def hooks_under_create_graph(lib):
    log = []
    m = lib.nn.Tanh()
    m.register_full_backward_hook(
        lambda mod, gi, go: log.append(([_l(g) for g in gi], gi[0].requires_grad)))
    x = lib.tensor([0.5, 1.0], requires_grad=True)
    (g,) = lib.autograd.grad(m(x).sum(), x, create_graph=True)
    g.sum().backward()
    log.append(_l(x.grad))
    return log


SCENARIOS = [local_and_global_hooks, kwargs_and_non_tensor_inputs,
             backward_hook_replaces_grad_input, inplace_on_hooked_module,
             deprecated_backward_hook, always_call_hook, no_input_requires_grad,
             hook_removal_and_order, identity_module, reused_module, tuple_output_partly_used,
             hooks_under_create_graph]

# Recorded from torch 2.13 (CPU).
EXPECTED = {'local_and_global_hooks': [('global_fw_pre', 'Sequential'),
                            ('global_fw_pre', 'Linear'),
                            'prepended',
                            ('global_fw', 'Linear'),
                            ('global_fw_pre', 'Tanh'),
                            ('global_fw', 'Tanh'),
                            ('global_fw_pre', 'Linear'),
                            ('global_fw', 'Linear'),
                            ('global_fw', 'Sequential'),
                            ('global_bw_pre', 'Sequential'),
                            ('global_bw_pre', 'Linear'),
                            ('lin2_bw_pre', [[1.0, 1.0, 1.0, 1.0]]),
                            ('global_bw',
                             'Linear',
                             [[-0.0, 0.6, 1.2, 1.8, -0.0, 0.6, 1.2, 1.8]],
                             [[2.0, 2.0, 2.0, 2.0]]),
                            ('global_bw_pre', 'Tanh'),
                            ('global_bw',
                             'Tanh',
                             [[-0.0, 0.1892, 0.0511, 0.009, -0.0, 0.075, 0.0183, 0.0032]],
                             [[-0.0, 0.6, 1.2, 1.8, -0.0, 0.6, 1.2, 1.8]]),
                            'tanh_bw',
                            ('global_bw_pre', 'Linear'),
                            ('global_bw',
                             'Linear',
                             [[1.8956, 2.3205, 2.7454, 1.8364, 2.246, 2.6557]],
                             [[1.0, 1.1892, 1.0511, 1.009, 1.0, 1.075, 1.0183, 1.0032]]),
                            ('lin0_bw',
                             [[1.8956, 2.3205, 2.7454, 1.8364, 2.246, 2.6557]],
                             [[1.0, 1.1892, 1.0511, 1.009, 1.0, 1.075, 1.0183, 1.0032]]),
                            ('global_bw',
                             'Sequential',
                             [[3.7911, 4.641, 5.4909, 3.6728, 4.4921, 5.3114]],
                             [[1.0, 1.0, 1.0, 1.0]]),
                            ('x.grad', [3.7911, 4.641, 5.4909, 3.6728, 4.4921, 5.3114]),
                            ('w0.grad',
                             [-1.6,
                              0.0,
                              1.6,
                              -1.9484,
                              -0.137,
                              1.6743,
                              -1.695,
                              -0.0394,
                              1.6162,
                              -1.6168,
                              -0.007,
                              1.6028])],
 'kwargs_and_non_tensor_inputs': [('fw_kwargs', {'scale': 2.0}),
                                  ('bw', [[6.0, 8.0], None, [0.0, 0.0]], [[1.0, 1.0], None]),
                                  ('k', 7),
                                  ('a.grad', [6.0, 8.0])],
 'backward_hook_replaces_grad_input': [7.0, 7.0],
 'inplace_on_hooked_module': ['Output 0 of BackwardHookFunction is a view and is being modified '
                              'inplace. This view was created inside a custom Function (or '
                              'because an input was returned as-is) and the autograd logic to '
                              'handle view+inplace would override the custom backward associated '
                              'with the custom Function, leading to incorrect gradients. This '
                              'behavior is forbidden. You can fix this by cloning the output of '
                              'the custom Function.',
                              'Output 0 of BackwardHookFunction is a view and is being modified '
                              'inplace. This view was created inside a custom Function (or '
                              'because an input was returned as-is) and the autograd logic to '
                              'handle view+inplace would override the custom backward associated '
                              'with the custom Function, leading to incorrect gradients. This '
                              'behavior is forbidden. You can fix this by cloning the output of '
                              'the custom Function.',
                              'allowed outside autograd'],
 'deprecated_backward_hook': [('old', 3, 1),
                              ['FutureWarning'],
                              'Cannot use both regular backward hooks and full backward hooks on '
                              'a single Module. Please use only one of them.'],
 'always_call_hook': [('always', None), 'boom'],
 'no_input_requires_grad': [('bw', (None,), 1), ['UserWarning']],
 'hook_removal_and_order': ['prepended',
                            'first',
                            'second',
                            'bw_pre_0',
                            'bw_pre_1',
                            'ctx',
                            'prepended',
                            'second',
                            'prepended',
                            'second'],
 'identity_module': ['pre', ([[3.0, 3.0]], [[3.0, 3.0]]), [3.0, 3.0]],
 'reused_module': [([[0.8135, 0.5878]], [[1.0, 1.0]]), ([[0.6398, 0.2469]], [[0.8135, 0.5878]])],
 'tuple_output_partly_used': [('pre', [[1.0], None, None]), ([[2.0], [0.0]], [[1.0], None, None])],
 'hooks_under_create_graph': [([[0.7864, 0.42]], True), [-0.7269, -0.6397]]}


@pytest.mark.parametrize("scenario", SCENARIOS, ids=lambda f: f.__name__)
def test_log_matches_pytorch(scenario):
    # The recorded log keeps the check meaningful where torch is not installed.
    log = scenario(distgrad)
    assert log == EXPECTED[scenario.__name__]
    assert torch is None or log == scenario(torch)


def test_no_hook_module_takes_fast_path(monkeypatch):
    m = distgrad.nn.Tanh()
    called = []
    monkeypatch.setattr(type(m), "_call_with_hooks",
                        lambda self, a, k: called.append(1) or self.forward(*a, **k))
    m(distgrad.ones(2))
    assert called == []
    h = m.register_forward_hook(lambda *a: None)
    m(distgrad.ones(2))
    assert called == [1]
    h.remove()
    g = distgrad.nn.modules.module.register_module_forward_pre_hook(lambda *a: None)
    m(distgrad.ones(2))
    g.remove()
    m(distgrad.ones(2))
    assert called == [1, 1]


def test_forward_pre_hook_bad_kwargs_return():
    m = distgrad.nn.Tanh()
    m.register_forward_pre_hook(lambda mod, a, kw: 3, with_kwargs=True)
    with pytest.raises(RuntimeError, match="forward pre-hook must return None or a tuple"):
        m(distgrad.ones(1))


def test_backward_hook_wrong_length():
    m = distgrad.nn.Linear(2, 2)
    m.register_full_backward_hook(lambda mod, gi, go: (gi[0], gi[0]))
    with pytest.raises(RuntimeError, match="invalid number of grad_input"):
        m(distgrad.ones(1, 2, requires_grad=True)).sum().backward()


def test_global_full_and_deprecated_hooks_exclude_each_other():
    # Like PyTorch, the first kind of global backward hook ever registered wins for good.
    mm = distgrad.nn.modules.global_hooks  # its flag; the functions are re-exported by .module
    saved = mm._global_is_full_backward_hook
    try:
        mm._global_is_full_backward_hook = None
        log = []
        h = mm.register_module_backward_hook(lambda mod, gi, go: log.append(type(mod).__name__))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            m = distgrad.nn.Sequential(distgrad.nn.Tanh())
            m(distgrad.tensor([0.5], requires_grad=True)).sum().backward()
        h.remove()
        assert log == ["Tanh", "Sequential"]
        with pytest.raises(RuntimeError, match="Cannot use both regular backward hooks and full"):
            mm.register_module_full_backward_hook(lambda *a: None)
    finally:
        mm._global_is_full_backward_hook = saved

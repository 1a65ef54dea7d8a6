"""Saved tensors: ``grad_fn._saved_*``, ``_raw_saved_*.register_hooks``, ``saved_tensors_hooks``."""
import threading

import numpy as np
import pytest

import distgrad
from distgrad.autograd.graph import disable_saved_tensors_hooks, saved_tensors_hooks
from distgrad.testing.oracle import torch


def _l(t):
    return [round(v, 4) for v in t.detach().reshape(-1).tolist()]


def saved_names(lib):
    x = lib.tensor([1.0, 2.0], requires_grad=True)
    w = lib.tensor([3.0, 4.0], requires_grad=True)
    out = []
    y = x * w
    out.append(("mul", y.grad_fn._saved_self is x, y.grad_fn._saved_other is w))
    e = x.exp()
    out.append(("exp result", e.grad_fn._saved_result is e, _l(e.grad_fn._saved_result)))
    p = x.pow(3)
    out.append(("pow", p.grad_fn._saved_self is x, p.grad_fn._saved_exponent))
    d = x / w
    out.append(("div", d.grad_fn._saved_self is x, d.grad_fn._saved_other is w))
    t = x.tanh()
    out.append(("tanh", _l(t.grad_fn._saved_result)))
    s = x.sigmoid()
    out.append(("sigmoid", _l(s.grad_fn._saved_result)))
    return out


def raw_saved_hooks(lib):
    log = []
    x = lib.tensor([1.0, 2.0], requires_grad=True)
    y = x * x
    y.grad_fn._raw_saved_self.register_hooks(
        lambda t: (log.append(("pack", _l(t))), t * 1)[1],
        lambda t: (log.append(("unpack", _l(t))), t)[1])
    log.append(_l(y.grad_fn._saved_self))
    y.sum().backward()
    log.append(("grad", _l(x.grad)))
    for access in (lambda: y.grad_fn._saved_self,
                   lambda: y.grad_fn._raw_saved_self.register_hooks(lambda t: t, lambda t: t)):
        try:
            access()
            log.append("no error")
        except RuntimeError:
            log.append("RuntimeError")
    return log


def default_hooks_nested(lib):
    log = []
    x = lib.tensor([1.0, 2.0], requires_grad=True)

    def pack(t):
        log.append(("pack", _l(t)))
        return t

    def unpack(t):
        log.append(("unpack", _l(t)))
        return t

    with lib.autograd.graph.saved_tensors_hooks(pack, unpack):
        y = x * x
        with lib.autograd.graph.saved_tensors_hooks(lambda t: (log.append("inner_pack"), t)[1],
                                                    lambda t: (log.append("inner_unpack"), t)[1]):
            z = y.sin()
    z.sum().backward()
    log.append(("grad", _l(x.grad)))
    return log


def custom_function_hooks(lib):
    log = []

    class Cube(lib.autograd.Function):
        @staticmethod
        def forward(ctx, a):
            ctx.save_for_backward(a)
            return a ** 3

        @staticmethod
        def backward(ctx, g):
            (a,) = ctx.saved_tensors
            return g * 3 * a * a

    x = lib.tensor([1.0, 2.0], requires_grad=True)
    with lib.autograd.graph.saved_tensors_hooks(lambda t: (log.append("pack"), t.clone())[1],
                                                lambda t: (log.append("unpack"), t)[1]):
        y = Cube.apply(x)
    y.sum().backward(retain_graph=True)
    y.sum().backward()
    log.append(("grad", _l(x.grad)))
    log.append(type(y.grad_fn).__name__)
    return log


SCENARIOS = [saved_names, raw_saved_hooks, default_hooks_nested, custom_function_hooks]

# Recorded from torch 2.13 (CPU).
EXPECTED = {'saved_names': [('mul', True, True),
                 ('exp result', False, [2.7183, 7.3891]),
                 ('pow', True, 3),
                 ('div', True, True),
                 ('tanh', [0.7616, 0.964]),
                 ('sigmoid', [0.7311, 0.8808])],
 'raw_saved_hooks': [('pack', [1.0, 2.0]),
                     ('unpack', [1.0, 2.0]),
                     [1.0, 2.0],
                     ('unpack', [1.0, 2.0]),
                     ('grad', [2.0, 4.0]),
                     'RuntimeError',
                     'RuntimeError'],
 'default_hooks_nested': [('pack', [1.0, 2.0]),
                          ('pack', [1.0, 2.0]),
                          'inner_pack',
                          'inner_unpack',
                          ('unpack', [1.0, 2.0]),
                          ('unpack', [1.0, 2.0]),
                          ('grad', [1.0806, -2.6146])],
 'custom_function_hooks': ['pack', 'unpack', 'unpack', ('grad', [6.0, 24.0]), 'CubeBackward']}


@pytest.mark.parametrize("scenario", SCENARIOS, ids=lambda f: f.__name__)
def test_log_matches_pytorch(scenario):
    # The recorded log keeps the check meaningful where torch is not installed.
    log = scenario(distgrad)
    assert log == EXPECTED[scenario.__name__]
    assert torch is None or log == scenario(torch)


def test_pack_once_unpack_per_use_with_offload():
    # The classic use: keep saved activations as NumPy copies, restore on demand.
    packs, unpacks = [], []

    def pack(t):
        packs.append(1)
        return t.detach().numpy().copy()

    def unpack(a):
        unpacks.append(1)
        return distgrad.from_numpy(a)

    x = distgrad.tensor([0.5, 1.5], requires_grad=True)
    with saved_tensors_hooks(pack, unpack):
        y = (x * x).exp()   # mul saves self and other (the same tensor), exp its result
    assert len(packs) == 3 and not unpacks
    y.sum().backward()
    assert len(unpacks) == 3
    expected = 2 * x.detach().numpy() * np.exp(x.detach().numpy() ** 2)
    np.testing.assert_allclose(x.grad.numpy(), expected, rtol=1e-6)


def test_hooks_are_thread_local():
    seen = []
    x = distgrad.ones(2, requires_grad=True)

    def other_thread():
        seen.append(len(distgrad.autograd.saved.hooks_state.stack))
        (x * x).sum().backward()

    with saved_tensors_hooks(lambda t: t, lambda t: t):
        th = threading.Thread(target=other_thread)
        th.start()
        th.join(5)
    assert seen == [0]


def test_disable_saved_tensors_hooks():
    with disable_saved_tensors_hooks("no hooks here"):
        with pytest.raises(RuntimeError, match="no hooks here"):
            with saved_tensors_hooks(lambda t: t, lambda t: t):
                pass
    with saved_tensors_hooks(lambda t: t, lambda t: t):
        pass  # allowed again outside the block

    @disable_saved_tensors_hooks("decorated")
    def f():
        with saved_tensors_hooks(lambda t: t, lambda t: t):
            pass
    with pytest.raises(RuntimeError, match="decorated"):
        f()


def test_unpack_must_return_tensor():
    x = distgrad.ones(2, requires_grad=True)
    with saved_tensors_hooks(lambda t: t, lambda t: 3):
        y = x * x
    with pytest.raises(TypeError):
        y.sum().backward()


def test_register_hooks_twice_raises():
    x = distgrad.ones(2, requires_grad=True)
    y = x * x
    y.grad_fn._raw_saved_self.register_hooks(lambda t: t, lambda t: t)
    with pytest.raises(RuntimeError):
        y.grad_fn._raw_saved_self.register_hooks(lambda t: t, lambda t: t)


def test_disable_saved_tensors_hooks_entered_twice():
    blocker = disable_saved_tensors_hooks("no hooks here")
    with blocker:
        with blocker:
            pass
        with pytest.raises(RuntimeError, match="no hooks here"):
            with saved_tensors_hooks(lambda t: t, lambda t: t):
                pass
    with saved_tensors_hooks(lambda t: t, lambda t: t):  # allowed again after the outer exit
        pass


def test_same_saved_tensors_hooks_object_nested():
    log = []
    hooks = saved_tensors_hooks(lambda t: (log.append("pack"), t)[1],
                                lambda t: (log.append("unpack"), t)[1])
    x = distgrad.ones(2, requires_grad=True)
    with hooks:
        with hooks:
            y = x * x
        z = y.exp()
    w = x.sin()  # outside both: no hooks
    (z.sum() + w.sum()).backward()
    assert log.count("pack") == 3 and log.count("unpack") == 3

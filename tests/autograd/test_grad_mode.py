"""no_grad, enable_grad, set_grad_enabled, inference_mode: context managers, decorators, threads."""
import threading

import pytest

import distgrad


def test_no_grad_context_and_decorator():
    x = distgrad.ones(2, requires_grad=True)
    with distgrad.no_grad():
        assert not distgrad.is_grad_enabled()
        assert not (x * 2).requires_grad
    assert distgrad.is_grad_enabled()

    @distgrad.no_grad()
    def f(t):
        return t * 2
    assert not f(x).requires_grad

    @distgrad.no_grad
    def g(t):
        return t * 2
    assert not g(x).requires_grad


def test_enable_grad_inside_no_grad():
    x = distgrad.ones(2, requires_grad=True)
    with distgrad.no_grad():
        with distgrad.enable_grad():
            assert (x * 2).requires_grad
        assert not (x * 2).requires_grad


def test_set_grad_enabled_as_function_and_context():
    x = distgrad.ones(2, requires_grad=True)
    with distgrad.set_grad_enabled(False):
        assert not (x * 2).requires_grad
    assert distgrad.is_grad_enabled()
    distgrad.set_grad_enabled(False)
    try:
        assert not distgrad.is_grad_enabled()
    finally:
        distgrad.set_grad_enabled(True)


def test_decorated_generator_keeps_mode_per_step():
    x = distgrad.ones(1, requires_grad=True)

    @distgrad.no_grad()
    def gen():
        for _ in range(2):
            yield (x * 2).requires_grad
    assert list(gen()) == [False, False]
    assert distgrad.is_grad_enabled()


def test_grad_mode_is_thread_local():
    seen = {}
    with distgrad.no_grad():
        def worker():
            seen["other"] = distgrad.is_grad_enabled()
        t = threading.Thread(target=worker)
        t.start()
        t.join(5)
        seen["here"] = distgrad.is_grad_enabled()
    assert seen == {"other": True, "here": False}


def test_inference_mode_tensors_refuse_autograd():
    w = distgrad.ones(2, requires_grad=True)
    with distgrad.inference_mode():
        assert distgrad.is_inference_mode_enabled()
        t = distgrad.ones(2) * 3
        assert t.is_inference()
        assert not (w * 2).requires_grad
    assert not distgrad.is_inference_mode_enabled()
    with pytest.raises(RuntimeError, match="Inference tensors cannot be saved for backward"):
        w * t
    with pytest.raises(RuntimeError, match="Inplace update to inference tensor outside InferenceMode"):
        t.add_(1)
    assert (t + w).requires_grad  # add saves nothing, so an inference operand is fine
    with pytest.raises(RuntimeError, match="inference tensor"):
        t.requires_grad_(True)


def test_inference_mode_decorator_and_disabled():
    @distgrad.inference_mode()
    def f():
        return distgrad.ones(1).is_inference()
    assert f()
    with distgrad.inference_mode(False):
        assert not distgrad.ones(1).is_inference()


def test_one_mode_object_entered_twice_restores_each_level():
    # The previous mode lives on the thread's stack, not on the object (PyTorch keeps it
    # on the object, so there the outer exit restores the inner entry's value).
    ng = distgrad.no_grad()
    with ng:
        with ng:
            pass
        assert not distgrad.is_grad_enabled()
    assert distgrad.is_grad_enabled()
    im = distgrad.inference_mode()
    with im:
        with im:
            pass
        assert distgrad.is_inference_mode_enabled()
    assert not distgrad.is_inference_mode_enabled() and distgrad.is_grad_enabled()

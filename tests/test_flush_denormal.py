"""``set_flush_denormal``: subnormal floats become zero in the calling thread and the
threads it starts afterwards, as with ``torch.set_flush_denormal``."""
import threading

import numpy as np
import pytest

import distgrad
from distgrad import flush_denormal

SUBNORMAL = 1e-39  # below float32's smallest normal number (1.18e-38)


@pytest.fixture(autouse=True)
def computing_with_subnormals():
    """Every test starts and ends with the default: subnormals are kept."""
    distgrad.set_flush_denormal(False)
    yield
    distgrad.set_flush_denormal(False)


def _product():
    return float((distgrad.tensor([SUBNORMAL], dtype=distgrad.float32) * 1.0)[0])


def test_flushing_makes_subnormal_inputs_and_results_zero_and_can_be_undone():
    assert _product() > 0
    assert distgrad.set_flush_denormal(True) is True
    assert _product() == 0.0
    normal = np.float32(1e-30)
    assert normal * np.float32(1e-10) == 0  # a result below the normal range: zero
    assert distgrad.set_flush_denormal(False) is True
    assert _product() > 0


def test_a_thread_started_afterwards_inherits_the_setting_one_started_before_does_not():
    def seen(out, go=None):
        if go is not None:
            go.wait(10)
        out.append(_product())

    before, go = [], threading.Event()
    early = threading.Thread(target=seen, args=(before, go))
    early.start()
    assert distgrad.set_flush_denormal(True)
    after = []
    late = threading.Thread(target=seen, args=(after,))
    late.start()
    late.join(10)
    go.set()
    early.join(10)
    assert after == [0.0]
    assert before[0] > 0  # its register was copied when it started


def test_backward_through_subnormal_gradients_gives_zero_gradients_when_flushing():
    def grad():
        x = distgrad.tensor([1.0, 2.0], dtype=distgrad.float32, requires_grad=True)
        (x * SUBNORMAL).sum().backward()
        return x.grad.numpy().tolist()

    assert all(g > 0 for g in grad())
    distgrad.set_flush_denormal(True)
    assert grad() == [0.0, 0.0]


def test_a_platform_whose_register_it_cannot_set_gets_false_and_nothing_changes(monkeypatch):
    monkeypatch.setattr(flush_denormal.platform, "system", lambda: "Plan9")
    assert distgrad.set_flush_denormal(True) is False
    assert _product() > 0


def test_flushing_context_restores_the_callers_setting_and_names_the_key_it_cannot_honour(
        monkeypatch):
    with flush_denormal.flushing(True):
        assert _product() == 0.0
    assert _product() > 0
    with flush_denormal.flushing(False):  # leaves the setting alone
        assert _product() > 0
    monkeypatch.setattr(flush_denormal.platform, "machine", lambda: "mips")
    with pytest.raises(RuntimeError, match="world.flush_denormal: this platform"):
        with flush_denormal.flushing(True):
            pass


def test_results_match_pytorch_in_both_modes():
    torch = pytest.importorskip("torch")
    values = np.array([SUBNORMAL, 1e-30, 3.0, -2e-39], dtype=np.float32)
    try:
        for mode in (False, True):
            assert torch.set_flush_denormal(mode) == distgrad.set_flush_denormal(mode)
            ours = (distgrad.from_numpy(values.copy()) * 1e-9).numpy()
            theirs = (torch.from_numpy(values.copy()) * 1e-9).numpy()
            assert ours.tobytes() == theirs.tobytes(), mode
    finally:
        torch.set_flush_denormal(False)


@pytest.mark.parametrize("mode", [1, "yes", None, np.bool_(True)])
def test_only_a_bool_is_taken_as_pytorch_insists(mode):
    with pytest.raises(RuntimeError, match="flush_denormal expects a bool, but got "):
        distgrad.set_flush_denormal(mode)
    with pytest.raises(TypeError):
        distgrad.set_flush_denormal(mode=True)  # positional only, as PyTorch's
    assert _product() > 0  # nothing changed


def test_the_refusal_names_the_type_as_pytorch_does():
    torch = pytest.importorskip("torch")
    for mode in (1, "yes", np.bool_(True)):
        with pytest.raises(RuntimeError) as theirs:
            torch.set_flush_denormal(mode)
        with pytest.raises(RuntimeError) as ours:
            distgrad.set_flush_denormal(mode)
        assert str(ours.value) == str(theirs.value)


def test_a_worker_asked_to_flush_where_it_cannot_says_so_before_joining(monkeypatch, capsys):
    import argparse

    from distgrad import worker
    parser = worker.add_arguments(argparse.ArgumentParser(prog="distgrad worker"))
    args = parser.parse_args(["--name", "w1", "--rank", "1", "--world-size", "2",
                              "--init-method", "tcp://127.0.0.1:9", "--flush-denormal"])
    monkeypatch.setattr(flush_denormal.platform, "system", lambda: "Plan9")
    with pytest.raises(SystemExit) as exited:
        worker.run(args, parser)
    assert exited.value.code == 2
    assert "--flush-denormal: this platform's floating-point control register" \
        in capsys.readouterr().err

"""Grad-mode switches set and restore the mode as PyTorch's do: nesting, the same object
entered twice, set_grad_enabled's call and block forms, exceptions, inference_mode(False),
decorated generators, threads. Compared with PyTorch; the recorded expectations keep every
check meaningful where torch is absent."""
import threading

import pytest

import distgrad
from distgrad.testing.oracle import torch

pytestmark = pytest.mark.timeout(60)


def nesting_and_reentry(lib):
    log = []
    mode = lib.is_grad_enabled
    blocker = lib.no_grad()
    with blocker:
        log.append(mode())
        with lib.enable_grad():
            log.append(mode())
            with blocker:  # the same object again, while open
                log.append(mode())
            log.append(mode())
        log.append(mode())
    log.append(mode())
    try:
        with lib.no_grad():
            raise ValueError
    except ValueError:
        log.append(mode())
    return log


def set_grad_enabled_forms(lib):
    log = []
    mode = lib.is_grad_enabled
    lib.set_grad_enabled(False)  # call form: takes effect at once, stays
    log.append(mode())
    lib.set_grad_enabled(True)
    with lib.set_grad_enabled(False):
        log.append(mode())
        with lib.set_grad_enabled(True):
            log.append(mode())
        log.append(mode())
    log.append(mode())
    with lib.no_grad():
        lib.set_grad_enabled(True)  # undone by the no_grad exit
        log.append(mode())
    log.append(mode())
    switch = lib.set_grad_enabled(False)  # made now, entered after the mode changed
    lib.set_grad_enabled(True)
    with switch:
        log.append(mode())
    log.append(mode())
    return log


def inference_mode_nesting(lib):
    log = []
    with lib.no_grad():
        with lib.inference_mode(False):
            log.append(lib.is_grad_enabled())
    with lib.inference_mode():
        log.append((lib.is_grad_enabled(), lib.is_inference_mode_enabled()))
        with lib.inference_mode(False):
            log.append((lib.is_grad_enabled(), lib.is_inference_mode_enabled()))
            log.append(lib.ones(1).is_inference())
        log.append((lib.is_grad_enabled(), lib.is_inference_mode_enabled()))
        log.append(lib.ones(1).is_inference())
    log.append((lib.is_grad_enabled(), lib.is_inference_mode_enabled()))
    with lib.inference_mode(False):
        log.append((lib.is_grad_enabled(), lib.is_inference_mode_enabled()))
    return log


def decorated_generator(lib):
    log = []

    @lib.no_grad()
    def steps():
        for _ in range(2):
            log.append(("inside", lib.is_grad_enabled()))
            yield
    with lib.enable_grad():
        for _ in steps():
            log.append(("between", lib.is_grad_enabled()))
    return log


def threads_have_their_own_mode(lib):
    log = []
    inside, release = threading.Event(), threading.Event()

    def other():
        with lib.no_grad():
            inside.set()
            release.wait(10)

    worker = threading.Thread(target=other)
    worker.start()
    assert inside.wait(10)
    log.append(lib.is_grad_enabled())
    release.set()
    worker.join(10)
    log.append(worker.is_alive())
    return log


SCENARIOS = [nesting_and_reentry, set_grad_enabled_forms, inference_mode_nesting,
             decorated_generator, threads_have_their_own_mode]

# Recorded from torch 2.13 (CPU).
EXPECTED = {
    "nesting_and_reentry": [False, True, False, True, False, True, True],
    "set_grad_enabled_forms": [False, False, True, False, True, True, True, False, True],
    "inference_mode_nesting": [True, (False, True), (True, False), False, (False, True), True,
                               (True, False), (True, False)],
    "decorated_generator": [("inside", False), ("between", True), ("inside", False),
                            ("between", True)],
    "threads_have_their_own_mode": [True, False],
}


@pytest.mark.parametrize("scenario", SCENARIOS, ids=lambda f: f.__name__)
def test_matches_pytorch(scenario):
    log = scenario(distgrad)
    assert distgrad.is_grad_enabled()
    assert log == EXPECTED[scenario.__name__]
    if torch is not None:
        assert log == scenario(torch)

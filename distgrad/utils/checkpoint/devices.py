"""What checkpoint stashes besides the inputs: the generators' states, and which device
type they belong to. distgrad computes on the CPU: its one generator is the global one
(``distgrad.manual_seed``), which ``preserve_rng_state`` saves at the forward and puts
back for the recomputation; there are no device generators, so the device-state helpers
have nothing to save and refuse device ids they are given.
"""
import warnings

from ... import accelerator
from ...autograd.device import CPU_ONLY
from ...autograd.tensor import Tensor

__all__ = ["DefaultDeviceType", "get_device_states", "set_device_states", "detach_variable",
           "check_backward_validity", "infer_device_type"]


class DefaultDeviceType:
    """The device type whose generator states checkpoint saves when no tensor argument
    names one: the accelerator's when there is one, else ``"cpu"`` (distgrad's case)."""

    _default_device_type = None

    @staticmethod
    def set_device_type(device="cuda"):
        DefaultDeviceType._default_device_type = device

    @staticmethod
    def get_device_type():
        if not DefaultDeviceType._default_device_type:
            current = accelerator.current_accelerator(True)
            DefaultDeviceType._default_device_type = current.type if current else "cpu"
        return DefaultDeviceType._default_device_type


def _tensors(args):
    """The tensors among ``args``, also inside lists, tuples and dicts."""
    stack = list(args)
    while stack:
        item = stack.pop()
        if isinstance(item, Tensor):
            yield item
        elif isinstance(item, (list, tuple)):
            stack.extend(item)
        elif isinstance(item, dict):
            stack.extend(item.values())


def infer_device_type(*args):
    """The device type of the non-CPU tensors among ``args`` (the default one if none)."""
    types = [t.device.type for t in _tensors(args) if t.device.type != "cpu"]
    if len(set(types)) > 1:
        warnings.warn(f"checkpoint: tensor arguments live on several device types "
                      f"({sorted(set(types))}); only the generator states of "
                      f"{'cuda' if 'cuda' in types else types[0]!r} are saved, so randomness "
                      "on the others is not replayed by the recomputation", stacklevel=2)
    if not types:
        return DefaultDeviceType.get_device_type()
    return "cuda" if "cuda" in types else types[0]


def get_device_states(*args):
    """``(device ids, generator states)`` of the non-CPU devices of ``args``' tensors:
    ``([], [])`` in distgrad, whose tensors are all on the CPU."""
    ids = [t.get_device() for t in _tensors(args) if t.device.type not in ("cpu", "meta")]
    if ids:
        raise RuntimeError(f"{CPU_ONLY}: no generator state for devices {ids}")
    return [], []


def set_device_states(devices, states, *, device_type=None):
    """Set the generator states of ``devices``; distgrad has no device generators, so only
    an empty ``devices`` is accepted."""
    if device_type == "meta":
        return
    devices = list(devices)
    if devices:
        raise RuntimeError(f"{CPU_ONLY}: cannot set the generator states of "
                           f"{device_type or DefaultDeviceType.get_device_type()} devices "
                           f"{devices}")


def detach_variable(inputs):
    """``inputs`` (a tuple) with each tensor detached, keeping its ``requires_grad``."""
    if not isinstance(inputs, tuple):
        raise RuntimeError("Only tuple of tensors is supported. Got Unsupported input type: "
                           f"{type(inputs).__name__}")
    out = []
    for value in inputs:
        if isinstance(value, Tensor):
            detached = value.detach()
            detached.requires_grad = value.requires_grad
            value = detached
        out.append(value)
    return tuple(out)


def check_backward_validity(inputs):
    """Warn when no tensor among ``inputs`` requires grad: a reentrant checkpoint of them
    records nothing, so nothing inside gets a gradient."""
    if not any(t.requires_grad for t in inputs if isinstance(t, Tensor)):
        warnings.warn("None of the inputs have requires_grad=True. Gradients will be None",
                      stacklevel=2)

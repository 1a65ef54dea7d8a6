"""``distgrad.device``: where a tensor lives, with ``torch.device``'s parsing and printing.

distgrad computes on the CPU only. Device objects of other types can still be
made and compared (``device("cuda" if cuda.is_available() else "cpu")`` is how
PyTorch programs pick theirs), but putting a tensor on one raises
``RuntimeError`` saying so.

>>> import distgrad
>>> distgrad.device("cpu", 0)
device(type='cpu', index=0)
>>> distgrad.zeros(2).device == distgrad.device("cpu")
True
"""
import builtins

__all__ = ["device", "cpu", "as_cpu_device", "CPU_ONLY"]

# PyTorch's list, in its order, so the error for a misspelt type reads the same.
_TYPES = ("cpu", "cuda", "ipu", "xpu", "mkldnn", "opengl", "opencl", "ideep", "hip", "ve",
          "fpga", "maia", "xla", "lazy", "vulkan", "mps", "meta", "hpu", "mtia", "privateuseone")

CPU_ONLY = "distgrad runs on the CPU only"


class device:
    """A device type (``"cpu"``, ``"cuda"``, ...) and an optional index.

    ``device("cpu")``, ``device("cpu:0")``, ``device("cpu", 0)`` and
    ``device(other_device)`` are accepted, as in PyTorch.
    """

    __slots__ = ("_type", "_index")

    def __init__(self, type, index=None):  # noqa: A002 - PyTorch's parameter name
        if isinstance(type, device):
            if index is not None:
                raise TypeError("device(): a device object takes no index")
            self._type, self._index = type._type, type._index
            return
        if isinstance(type, int) and not isinstance(type, bool):
            # PyTorch reads a bare ordinal as the current accelerator's device.
            raise RuntimeError("Cannot access accelerator device when none is available.")
        if not isinstance(type, str):
            raise TypeError(f"device(): argument 'type' must be str or device, not "
                            f"{builtins.type(type).__name__}")
        if index is not None and (not isinstance(index, int)
                                  or isinstance(index, bool)):
            raise TypeError(f"device(): argument 'index' (position 2) must be int, not "
                            f"{builtins.type(index).__name__}")
        if not type:
            raise RuntimeError("Device string must not be empty")
        name, sep, ordinal = type.partition(":")
        if name not in _TYPES:
            raise RuntimeError(f"Expected one of {', '.join(_TYPES)} device type at start of "
                               f"device string: {type}")
        if sep:
            if index is not None:
                raise RuntimeError("type (string) must not include an index because index was "
                                   f"passed explicitly: {type}")
            if not ordinal.isdigit() or (len(ordinal) > 1 and ordinal[0] == "0"):
                raise RuntimeError(f"Invalid device string: {type!r}")
            index = int(ordinal)
        if index is not None and index < 0:
            raise RuntimeError("Device index must not be negative")
        self._type, self._index = name, index

    @property
    def type(self):
        return self._type

    @property
    def index(self):
        return self._index

    def __eq__(self, other):
        if not isinstance(other, device):
            return NotImplemented
        return self._type == other._type and self._index == other._index

    def __hash__(self):
        return hash((self._type, self._index))

    def __str__(self):
        return self._type if self._index is None else f"{self._type}:{self._index}"

    def __repr__(self):
        if self._index is None:
            return f"device(type={self._type!r})"
        return f"device(type={self._type!r}, index={self._index})"

    def __reduce__(self):
        return (device, (self._type, self._index))

    # ``with distgrad.device("cpu"):`` is the default already; any other device
    # could only fail later, so it fails here, where the program names it.
    def __enter__(self):
        as_cpu_device(self)
        return self

    def __exit__(self, *exc):
        return False


cpu = device("cpu")


def as_cpu_device(spec, what="device"):
    """The CPU device ``spec`` names (``None``, ``"cpu"``, ``"cpu:0"``, a device), or
    ``RuntimeError`` for any other device; ``TypeError``/``RuntimeError`` as
    :class:`device` for what is not a device at all."""
    if spec is None:
        return cpu
    d = spec if isinstance(spec, device) else device(spec)
    if d._type != "cpu":
        raise RuntimeError(f"{CPU_ONLY}: {what} {str(d)!r} is not available (use 'cpu')")
    return d

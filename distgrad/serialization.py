"""``distgrad.save`` / ``distgrad.load``: checkpoints in the RPC wire format (no pickle).

A file is one msgpack array ``[magic, version, body, [buffer, ...]]`` where ``body``
and the buffers are exactly what :func:`distgrad.rpc.wire.encode` produces for the
object: tensors, arrays, containers (dict, list, tuple), numbers, strings, dtypes.
Loading can therefore never run code, as ``torch.load(weights_only=True)`` promises:
functions and other objects are refused on save (TypeError naming the type) and on
load (the codec has no resolver here).
"""
__all__ = ["save", "load"]

_MAGIC = "distgrad-checkpoint"
_VERSION = 1


def _is_path(f):
    return isinstance(f, (str, bytes)) or hasattr(f, "__fspath__")


def save(obj, f):
    """Write ``obj`` (a state_dict, tensors, containers) to a path or a binary file."""
    import msgpack
    from .rpc import wire  # imported here: the RPC layer (and pyzmq) load on first use
    try:
        body, buffers = wire.encode(obj)
    except TypeError as e:  # the codec's message names the type; say who refused it
        raise TypeError(f"distgrad.save: {e}") from None
    data = msgpack.packb([_MAGIC, _VERSION, body, [bytes(memoryview(b)) for b in buffers]])
    if _is_path(f):
        with open(f, "wb") as fh:
            fh.write(data)
    else:
        f.write(data)


def load(f, map_location=None, weights_only=True):
    """Read what :func:`save` wrote; tensors come back writable and detached from the file."""
    import msgpack
    from .rpc import wire
    from .rpc.errors import ProtocolError
    if _is_path(f):
        with open(f, "rb") as fh:
            data = fh.read()
    else:
        data = f.read()
    try:
        magic, version, body, buffers = msgpack.unpackb(data, raw=False)
    except Exception:  # noqa: BLE001 - any malformation is the same error for the user
        raise ProtocolError(f"{getattr(f, 'name', f)!r} is not a distgrad checkpoint") from None
    if magic != _MAGIC or version != _VERSION:
        raise ProtocolError(f"{getattr(f, 'name', f)!r} is not a distgrad checkpoint "
                            f"(version {_VERSION})")
    return _writable(wire.decode(body, buffers))


def _writable(obj):
    """Decoded arrays are read-only views of the file's bytes; give each its own copy."""
    from .autograd.tensor import Tensor
    import numpy as np
    if isinstance(obj, Tensor):
        obj._data = obj._data.copy()
        return obj
    if isinstance(obj, np.ndarray):
        return obj.copy()
    if isinstance(obj, dict):
        return {k: _writable(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_writable(v) for v in obj]
    if isinstance(obj, tuple):
        return tuple(_writable(v) for v in obj)
    return obj

"""``distgrad.save`` / ``distgrad.load``: checkpoints in the value codec's format (no pickle).

A file is one msgpack array ``[magic, version, data]`` where ``data`` is what
:func:`distgrad.codec.dumps` makes of the object: tensors, arrays, containers
(dict, list, tuple), numbers, strings, dtypes. Loading can therefore never run
code, as ``torch.load(weights_only=True)`` promises: functions and other objects
are refused on save (TypeError naming the type) and on load.
"""
__all__ = ["save", "load"]

_MAGIC = "distgrad-checkpoint"
_VERSION = 2


def _is_path(f):
    return isinstance(f, (str, bytes)) or hasattr(f, "__fspath__")


def save(obj, f):
    """Write ``obj`` (a state_dict, tensors, containers) to a path or a binary file."""
    import msgpack
    from . import codec
    try:
        data = codec.dumps(obj)
    except (TypeError, codec.CodecError) as e:  # the codec's message names the type
        raise type(e)(f"distgrad.save: {e}") from None
    blob = msgpack.packb([_MAGIC, _VERSION, data])
    if _is_path(f):
        with open(f, "wb") as fh:
            fh.write(blob)
    else:
        f.write(blob)


def load(f, map_location=None, weights_only=True):
    """Read what :func:`save` wrote; tensors come back writable and detached from the file."""
    import msgpack
    from . import codec
    name = getattr(f, "name", f)
    if _is_path(f):
        with open(f, "rb") as fh:
            blob = fh.read()
    else:
        blob = f.read()
    try:
        magic, version, data = msgpack.unpackb(blob, raw=False)
    except Exception:  # noqa: BLE001 - any malformation is the same error for the user
        raise RuntimeError(f"{name!r} is not a distgrad checkpoint") from None
    if magic != _MAGIC or version != _VERSION:
        raise RuntimeError(f"{name!r} is not a distgrad checkpoint of version {_VERSION}")
    try:
        return _writable(codec.loads(data))
    except codec.CodecError as e:
        raise RuntimeError(f"{name!r} is a damaged distgrad checkpoint: {e}") from None


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

"""How a DataLoader worker's results reach the parent: :mod:`distgrad.codec` frames on a pipe.

Each worker writes to a pipe of its own (``multiprocessing.Pipe(duplex=False)``;
one writer per pipe, so messages never interleave). A message is three parts,
each a ``send_bytes`` frame::

    header   struct: the number of array buffers and their sizes
    body     codec-encoded [task index, kind, payload]
    buffers  the arrays' bytes, straight from the worker's arrays

The parent receives the buffers into ``bytearray`` s, so the tensors of a batch
are writable without another copy (small arrays ride in the body and are
copied). Nothing is unpickled: a batch holds what the codec carries (tensors,
arrays, numbers, strings, bytes, lists, tuples, dicts, sets) plus namedtuples,
which travel as their class's name and come back as that class if the parent
has it loaded (else as a plain tuple). Exceptions travel as their class's name,
message and traceback text and are raised again as PyTorch's DataLoader does
(``Caught ValueError in DataLoader worker process 0. Original Traceback ...``).
"""
import struct
import sys
import traceback

import numpy as np

from ... import codec
from ..._tensor import Tensor
from ...autograd._internal import array_of, set_array

__all__ = ["send", "receive", "capture_exception", "raise_exception", "WorkerDied"]

DATA, ERROR, END, RESUMED = "data", "error", "end", "resumed"
_KINDS = (DATA, ERROR, END, RESUMED)

# codec extension code of a namedtuple record (distgrad.codec's registry)
_NAMEDTUPLE_CODE = 20


class WorkerDied(Exception):
    """The pipe ended mid-message or before one: the worker is gone."""


class _NamedTupleRecord:
    __slots__ = ("module", "qualname", "values")

    def __init__(self, module, qualname, values):
        self.module, self.qualname, self.values = module, qualname, values


def _loaded_class(module, qualname, base):
    """The class ``module.qualname`` if the parent has already imported it and it is a
    subclass of ``base``, else ``None``. Nothing is imported or called on the way."""
    if module == "__mp_main__":  # the parent's __main__, as a spawned child names it
        module = "__main__"
    obj = sys.modules.get(module)
    for part in qualname.split("."):
        obj = getattr(obj, part, None)
    if (isinstance(obj, type) and issubclass(obj, base)
            and obj.__module__ in (module, "__mp_main__") and obj.__qualname__ == qualname):
        return obj
    return None


def _decode_namedtuple(payload, dec):
    if type(payload) is not list or len(payload) != 3 or type(payload[2]) is not list:
        raise codec.CodecError("malformed namedtuple record")
    module, qualname, values = payload
    cls = _loaded_class(str(module), str(qualname), tuple)
    if cls is not None and hasattr(cls, "_fields") and len(cls._fields) == len(values):
        return cls(*values)
    return tuple(values)


codec.register(_NamedTupleRecord, _NAMEDTUPLE_CODE,
               lambda r, enc: [r.module, r.qualname, r.values], _decode_namedtuple)


def _with_records(obj):
    """``obj`` with every namedtuple replaced by a record the codec can carry (the codec
    itself sends a namedtuple as a plain tuple)."""
    t = type(obj)
    if t is list:
        return [_with_records(x) for x in obj]
    if t is dict:
        return {k: _with_records(v) for k, v in obj.items()}
    if isinstance(obj, tuple):
        values = [_with_records(x) for x in obj]
        if hasattr(t, "_fields"):
            return _NamedTupleRecord(t.__module__, t.__qualname__, values)
        return tuple(values)
    return obj


def send(conn, task_idx, kind, payload=None):
    """Write one message; ``TypeError``/``CodecError`` if the payload cannot travel."""
    body, buffers = codec.encode([task_idx, kind, _with_records(payload)])
    sizes = [memoryview(b).nbytes for b in buffers]
    conn.send_bytes(struct.pack(f"!I{len(sizes)}Q", len(sizes), *sizes))
    conn.send_bytes(body)
    for b in buffers:
        conn.send_bytes(b)


def receive(conn):
    """Read one message: ``(task_idx, kind, payload)``; ``WorkerDied`` if the pipe ended."""
    try:
        header = conn.recv_bytes()
        (count,) = struct.unpack_from("!I", header)
        sizes = struct.unpack_from(f"!{count}Q", header, 4)
        body = conn.recv_bytes()
        buffers = []
        for size in sizes:
            buf = bytearray(size)
            if size:
                conn.recv_bytes_into(buf)
            else:
                conn.recv_bytes()
            buffers.append(buf)
    except (EOFError, OSError, struct.error) as e:
        raise WorkerDied(str(e)) from None
    task_idx, kind, payload = codec.decode(body, buffers)
    if kind not in _KINDS:
        raise codec.CodecError(f"unknown DataLoader message kind {kind!r}")
    return task_idx, kind, _writable(payload)


def _writable_array(a):
    try:
        a.flags.writeable = True  # the bytes are the parent's own bytearray
        return a
    except ValueError:  # an array inlined in the (immutable) body
        return a.copy()


def _writable(obj):
    """The decoded batch with writable tensors and arrays, as a batch from PyTorch is."""
    if isinstance(obj, Tensor):
        set_array(obj, _writable_array(array_of(obj)))
        return obj
    if type(obj) is np.ndarray:
        return _writable_array(obj)
    if type(obj) is list:
        for i, x in enumerate(obj):
            obj[i] = _writable(x)
        return obj
    if type(obj) is dict:
        for k, v in obj.items():
            obj[k] = _writable(v)
        return obj
    if isinstance(obj, tuple):
        values = [_writable(x) for x in obj]
        return type(obj)(*values) if hasattr(type(obj), "_fields") else tuple(values)
    return obj


def capture_exception(where):
    """The exception being handled, as a payload: class name, where, traceback text."""
    exc_type, exc, tb = sys.exc_info()
    text = "".join(traceback.format_exception(exc_type, exc, tb))
    return [exc_type.__module__, exc_type.__qualname__, where, text]


class KeyErrorMessage(str):
    """A str whose repr is itself, so a KeyError prints the traceback readably."""

    __slots__ = ()

    def __repr__(self):
        return self


def raise_exception(payload):
    """Raise the worker's exception again, as PyTorch's ``ExceptionWrapper.reraise`` does:
    the same class when the parent has it loaded (else ``RuntimeError``), with the
    worker's traceback in the message."""
    module, qualname, where, text = (str(x) for x in payload)
    msg = f"Caught {qualname.rpartition('.')[2]} {where}.\nOriginal {text}"
    cls = _loaded_class(module, qualname, Exception)
    if cls is KeyError:
        msg = KeyErrorMessage(msg)
    try:
        exception = cls(msg) if cls is not None else RuntimeError(msg)
    except Exception:  # an exception class that wants other arguments
        raise RuntimeError(msg) from None
    raise exception

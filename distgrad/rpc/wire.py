"""Wire codec: msgpack header and body, array bytes as separate zero-copy frames.

A message is ``[header, body, buf0, buf1, ...]`` (see PROTOCOL.md). The header is
``[version, kind, msg_id, src_rank, extra]``. The body is msgpack with extension
types for what msgpack lacks; an array in the body is ``[dtype, shape, index]``
and its bytes are frame ``2 + index``, sent with ``copy=False`` and received as a
read-only ``np.frombuffer`` view over the frame, so no payload is copied in Python.
Never pickle: unknown types raise TypeError on the sender, unknown extension codes
raise ProtocolError on the receiver.
"""
import threading
import types

import msgpack
import numpy as np
import zmq

from .errors import ProtocolError

__all__ = ["VERSION", "Kind", "encode", "decode", "pack_header", "unpack_header"]

VERSION = 1
MAX_HEADER = 64 * 1024


class Kind:
    CALL = 1      # request: body = [target, args, kwargs, remote_ref or None]
    REPLY = 2     # response: body = value
    ERROR = 3     # response: body = [type name, module, message, traceback]
    PING = 4      # heartbeat probe; answered with PONG
    PONG = 5
    ALL = frozenset((1, 2, 3, 4, 5))


EXT_ARRAY, EXT_TUPLE, EXT_COMPLEX, EXT_NPSCALAR, EXT_DTYPE, EXT_TENSOR, EXT_RREF, \
    EXT_WORKERINFO, EXT_EXC, EXT_BIGINT, EXT_SET, EXT_FUNC = range(1, 13)

_FUNC_TYPES = (types.FunctionType, types.BuiltinFunctionType, type)

_packb = msgpack.packb
_unpackb = msgpack.unpackb
_ExtType = msgpack.ExtType

_tensor_cls = None


def _tensor_type():
    """distgrad's Tensor class, imported lazily (the RPC layer works without it)."""
    global _tensor_cls
    if _tensor_cls is None:
        try:
            from distgrad.autograd.tensor import Tensor
        except ImportError:
            return None
        _tensor_cls = Tensor
    return _tensor_cls


def pack_header(kind, msg_id, src_rank, extra=None):
    return _packb([VERSION, kind, msg_id, src_rank, extra])


def unpack_header(data):
    """Validate and return (kind, msg_id, src_rank, extra); ProtocolError if malformed."""
    if len(data) > MAX_HEADER:
        raise ProtocolError(f"header of {len(data)} bytes exceeds {MAX_HEADER}")
    try:
        h = _unpackb(data, raw=False, strict_map_key=False,
                     ext_hook=_no_ext)
    except ProtocolError:
        raise
    except Exception as e:
        raise ProtocolError(f"malformed header: {e}") from None
    if not isinstance(h, list) or len(h) != 5:
        raise ProtocolError("malformed header: expected a list of 5 items")
    version, kind, msg_id, src, extra = h
    if version != VERSION:
        raise ProtocolError(f"unknown protocol version {version!r} (this side speaks {VERSION})")
    if kind not in Kind.ALL:
        raise ProtocolError(f"unknown message kind {kind!r}")
    if type(msg_id) is not int or type(src) is not int:
        raise ProtocolError("malformed header: msg_id and src must be integers")
    return kind, msg_id, src, extra


def _no_ext(code, data):
    raise ProtocolError(f"extension type {code} not allowed here")


#: Arrays smaller than this ride inside the body (as msgpack bin) instead of in a
#: frame of their own: for tiny arrays a frame costs more than copying the bytes.
INLINE_MAX = 1024


def _array_payload(a, buffers):
    dt = a.dtype
    if dt.hasobject or dt.fields is not None or dt.subdtype is not None:
        raise TypeError(f"arrays of dtype {dt} cannot travel over RPC")
    if not a.flags.c_contiguous:
        a = np.ascontiguousarray(a)  # the only copy: non-contiguous input
    if a.nbytes < INLINE_MAX:
        return [dt.str, list(a.shape), a.tobytes()]
    frame = _received_frame(a)
    buffers.append(frame if frame is not None else a.reshape(-1).view(np.uint8))
    return [dt.str, list(a.shape), len(buffers) - 1]


def _received_frame(a):
    """The zmq.Frame whose whole buffer ``a`` views, if any: re-sending the Frame
    shares the message by reference count instead of registering a new zero-copy
    buffer (which pyzmq releases through its garbage-collector thread)."""
    b = a.base
    while isinstance(b, np.ndarray):
        b = b.base
    if isinstance(b, memoryview) and isinstance(b.obj, zmq.Frame) and b.nbytes == a.nbytes:
        return b.obj
    return None


def _ext(code, data):
    return _tuple_new(_ExtType, (code, data))  # ExtType without its validating __new__


_tuple_new = tuple.__new__
_tls = threading.local()


class _Encoder:
    """Reusable per-thread encoder: building a msgpack Packer per call costs more
    than packing a small request, so packers are kept, one per nesting depth."""

    def __init__(self):
        self.buffers = None
        self.rref_encoder = None
        self.busy = False
        self._packers = []
        self._depth = 0

    def pack(self, obj):
        d = self._depth
        if d == len(self._packers):
            self._packers.append(msgpack.Packer(default=self.default, strict_types=True,
                                                autoreset=True))
        self._depth = d + 1
        try:
            return self._packers[d].pack(obj)
        finally:
            self._depth = d

    def default(self, o):
        pack, buffers = self.pack, self.buffers
        if isinstance(o, np.ndarray):
            return _ext(EXT_ARRAY, pack(_array_payload(o, buffers)))
        if isinstance(o, tuple):
            return _ext(EXT_TUPLE, pack(list(o)))
        T = _tensor_type()
        if T is not None and isinstance(o, T):
            return _ext(EXT_TENSOR, pack(_array_payload(np.asarray(o._data), buffers)
                                         + [bool(o.requires_grad)]))
        if isinstance(o, np.generic):
            if o.dtype.hasobject:
                raise TypeError(f"numpy scalar of dtype {o.dtype} cannot travel over RPC")
            return _ext(EXT_NPSCALAR, pack([o.dtype.str, o.tobytes()]))
        if isinstance(o, complex):
            return _ext(EXT_COMPLEX, pack([o.real, o.imag]))
        if isinstance(o, np.dtype):
            if o.hasobject:
                raise TypeError("object dtype cannot travel over RPC")
            return _ext(EXT_DTYPE, pack(o.str))
        if isinstance(o, int):
            if type(o) is int:  # beyond 64 bits
                return _ext(EXT_BIGINT, str(o).encode())
            return int(o)
        if isinstance(o, float):
            return float(o)
        if isinstance(o, str):
            return str(o)
        if isinstance(o, (bytearray, memoryview)):
            return bytes(o)
        if isinstance(o, dict):
            return dict(o)
        if isinstance(o, list):
            return list(o)
        if isinstance(o, (set, frozenset)):
            return _ext(EXT_SET, pack(list(o)))
        if isinstance(o, _FUNC_TYPES):
            from .resolve import ref_of
            return _ext(EXT_FUNC, ref_of(o).encode())
        from .rref import RRef
        if isinstance(o, RRef):
            if self.rref_encoder is None:
                raise TypeError("RRef arguments need a running RPC agent")
            return _ext(EXT_RREF, pack(self.rref_encoder(o)))
        from .worker_info import WorkerInfo
        if isinstance(o, WorkerInfo):
            return _ext(EXT_WORKERINFO, pack([o.name, o.id]))
        if isinstance(o, BaseException):
            from .errors import describe_exception
            return _ext(EXT_EXC, pack(describe_exception(o, "")))
        raise TypeError(f"object of type {type(o).__module__}.{type(o).__qualname__} "
                        "cannot be sent over RPC (no pickling; send arrays, tensors, "
                        "numbers, strings, containers, RRefs)")


def encode(obj, rref_encoder=None):
    """Return (body bytes, list of buffers) for ``obj``.

    ``rref_encoder(rref) -> list`` serialises RRefs (it registers forks with the
    owner); without it RRefs are refused.
    """
    enc = getattr(_tls, "enc", None)
    if enc is None or enc.busy:  # busy: an RRef encoder sending while we encode
        enc = _Encoder()
        if getattr(_tls, "enc", None) is None:
            _tls.enc = enc
    buffers = []
    enc.buffers, enc.rref_encoder, enc.busy = buffers, rref_encoder, True
    try:
        body = enc.pack(obj)
    except OverflowError as e:
        raise TypeError(f"value cannot be sent over RPC: {e}") from None
    finally:
        enc.buffers = enc.rref_encoder = None
        enc.busy = False
        enc._depth = 0
    return body, buffers


_dtypes = {}


def _dtype(name):
    dt = _dtypes.get(name)
    if dt is None:
        dt = np.dtype(name)
        if dt.hasobject:
            raise ProtocolError("object arrays are not accepted")
        if len(_dtypes) < 256:
            _dtypes[name] = dt
    return dt


def _array_from(meta, frames):
    dtype, shape, where = meta[0], meta[1], meta[2]
    dt = _dtype(dtype)
    if type(where) is bytes:  # a small array inlined in the body
        buf = where
    else:
        buf = frames[where]
        buf = buf.buffer if hasattr(buf, "buffer") else buf
    n = 1
    for s in shape:
        n *= s
    if len(buf) != n * dt.itemsize:
        raise ProtocolError(f"array data has {len(buf)} bytes, expected {n * dt.itemsize}")
    a = np.frombuffer(buf, dtype=dt)
    if len(shape) != 1:
        a = a.reshape(shape)
    if a.flags.writeable:
        a.flags.writeable = False
    return a


def decode(body, frames, rref_decoder=None, resolver=None, max_size=4 << 30):
    """Inverse of :func:`encode`; ``frames`` are the received buffer frames.

    Functions and classes arrive as ``module:qualname`` and become objects only
    through ``resolver`` (the allowlist check); without one they are refused.

    Any malformation raises :class:`ProtocolError`.
    """
    def ext_hook(code, data):
        if code == EXT_ARRAY:
            return _array_from(_unpackb(data), frames)
        if code == EXT_TUPLE:
            return tuple(_unpackb(data, ext_hook=ext_hook, raw=False, strict_map_key=False))
        if code == EXT_TENSOR:
            meta = _unpackb(data)
            T = _tensor_type()
            arr = _array_from(meta, frames)
            if T is None:
                return arr
            return T._wrap(arr, requires_grad=bool(meta[3]))
        if code == EXT_NPSCALAR:
            dt, raw = _unpackb(data)
            dt = np.dtype(dt)
            if dt.hasobject:
                raise ProtocolError("object scalars are not accepted")
            return np.frombuffer(raw, dtype=dt)[0]
        if code == EXT_COMPLEX:
            re, im = _unpackb(data)
            return complex(re, im)
        if code == EXT_DTYPE:
            dt = np.dtype(_unpackb(data, raw=False))
            if dt.hasobject:
                raise ProtocolError("object dtype is not accepted")
            return dt
        if code == EXT_BIGINT:
            return int(data.decode())
        if code == EXT_SET:
            return set(_unpackb(data, ext_hook=ext_hook, raw=False, strict_map_key=False))
        if code == EXT_RREF:
            if rref_decoder is None:
                raise ProtocolError("RRef received outside an RPC agent")
            return rref_decoder(_unpackb(data, raw=False))
        if code == EXT_FUNC:
            if resolver is None:
                raise ProtocolError("functions are not accepted here")
            return resolver(data.decode())
        if code == EXT_WORKERINFO:
            from .worker_info import WorkerInfo
            name, wid = _unpackb(data, raw=False)
            return WorkerInfo(name, wid)
        if code == EXT_EXC:
            from .errors import rebuild_exception
            t, m, msg, tb = _unpackb(data, raw=False)
            return rebuild_exception(t, m, msg, tb, "?")
        raise ProtocolError(f"unknown extension type {code}")

    if len(body) > max_size:
        raise ProtocolError(f"body of {len(body)} bytes exceeds the limit {max_size}")
    try:
        return _unpackb(body, ext_hook=ext_hook, raw=False, strict_map_key=False)
    except ProtocolError:
        raise
    except Exception as e:
        raise ProtocolError(f"malformed body: {type(e).__name__}: {e}") from None

"""The value codec: msgpack with extension types, array bytes as separate buffers.

One codec serves RPC messages, checkpoints (``distgrad.save``/``load``), the
activation store and data-loader workers. ``encode(obj)`` returns ``(body,
buffers)``: the body is msgpack, and each array of :data:`INLINE_MAX` bytes or
more is ``[dtype, shape, index]`` in the body while its bytes are
``buffers[index]`` (a view, never a copy, of a contiguous array). ``decode``
returns read-only ``np.frombuffer`` views over the buffers it is given.

Types that msgpack lacks travel as extension types. The codec knows NumPy and
the Python built-ins; other types register themselves (the codec imports none
of them)::

    register(WorkerInfo, 8, encode=lambda w, enc: [w.name, w.id],
             decode=lambda payload, dec: WorkerInfo(*payload))

``encode(obj, enc)`` returns a msgpack-able payload (it may contain any value
the codec can encode; ``enc.array(a)`` stores an array and returns its
reference, ``enc.context`` is what the caller of :func:`encode` passed);
``decode(payload, dec)`` rebuilds the object (``dec.array(ref)``,
``dec.context``, ``dec.resolve(ref)`` for a function or class reference). A
type whose encoder needs a context (an RRef needs an RPC agent) raises
``TypeError`` without one. A context may also move large arrays
out of band: ``context.external_array(a)`` returns a msgpack-able reference (or
None to decline) and the decoding side's ``context.external_buffer(ref)``
returns the bytes (RPC's shared-memory path).

Nothing is pickled or evaluated. Unknown types raise ``TypeError`` on encode,
unknown extension codes :class:`CodecError` on decode. Untrusted input is
bounded: containers nest at most :data:`MAX_DEPTH` deep (the sender refuses
what the receiver would refuse), arrays must match their buffers exactly, and
object dtypes are refused.
"""
import threading

import numpy as np

__all__ = ["register", "encode", "decode", "dumps", "loads", "CodecError",
           "UnknownExtensionError", "INLINE_MAX", "MAX_DEPTH"]

#: Arrays smaller than this ride inside the body (as msgpack bin) instead of in a
#: buffer of their own: for tiny arrays a frame costs more than copying the bytes.
INLINE_MAX = 1024

#: How deep tuples, sets and registered types may nest inside each other. Each
#: level of decoding costs a C stack frame of the msgpack unpacker (tens of KB),
#: so the bound keeps a hostile message from overflowing a thread's stack.
MAX_DEPTH = 32

EXT_ARRAY, EXT_TUPLE, EXT_COMPLEX, EXT_NPSCALAR, EXT_DTYPE = 1, 2, 3, 4, 5
EXT_BIGINT, EXT_SET = 10, 11
_BUILTIN_CODES = frozenset((EXT_ARRAY, EXT_TUPLE, EXT_COMPLEX, EXT_NPSCALAR, EXT_DTYPE,
                            EXT_BIGINT, EXT_SET))


class CodecError(ValueError):
    """Data that cannot be decoded (malformed, truncated, over a limit) or encoded
    within the limits."""


class UnknownExtensionError(CodecError):
    """An extension code that no type registered (in this process, so far): the module
    that registers it may not be imported yet."""

    def __init__(self, code):
        super().__init__(f"unknown extension type {code}")
        self.code = code


class _Handler:
    __slots__ = ("cls", "code", "encode", "decode")

    def __init__(self, cls, code, encode, decode):
        self.cls, self.code, self.encode, self.decode = cls, code, encode, decode


_by_type = {}    # exact type -> _Handler (subclasses are added on first sight)
_by_code = {}    # ext code -> _Handler
_registered = []  # handlers in registration order, for isinstance lookups
_registry_lock = threading.Lock()


def register(cls, code, encode, decode):
    """Make ``cls`` (a class or a tuple of classes, and their subclasses) travel as
    extension type ``code``.

    ``code`` is 0..127 and unique. Registering the same classes and code again
    replaces the functions (a module reloaded in a test).
    """
    if not (0 <= code <= 127) or code in _BUILTIN_CODES:
        raise ValueError(f"extension code {code} is reserved or out of range 0..127")
    classes = cls if isinstance(cls, tuple) else (cls,)
    with _registry_lock:
        old = _by_code.get(code)
        if old is not None and old.cls != classes:
            raise ValueError(f"extension code {code} is taken by {old.cls}")
        h = _Handler(classes, code, encode, decode)
        _by_code[code] = h
        _registered[:] = [x for x in _registered if x.code != code] + [h]
        for t in [t for t in _by_type if issubclass(t, classes)]:
            del _by_type[t]
        for c in classes:
            _by_type[c] = h


def _handler_for(t):
    h = _by_type.get(t)
    if h is None:
        for cand in _registered:
            if issubclass(t, cand.cls):
                h = _by_type[t] = cand
                break
    return h


_msgpack = None


def _mp():
    """msgpack, imported on first use: ``import distgrad`` works without it."""
    global _msgpack
    if _msgpack is None:
        import msgpack
        _msgpack = msgpack
    return _msgpack


_tuple_new = tuple.__new__


def _ext(code, data):
    return _tuple_new(_mp().ExtType, (code, data))  # ExtType without its validating __new__


def _check_dtype(dt):
    if dt.hasobject or dt.fields is not None or dt.subdtype is not None:
        raise TypeError(f"arrays of dtype {dt} cannot be encoded (no Python objects, no "
                        "structured dtypes)")


class Encoder:
    """Reusable per-thread encoder state; registered encoders receive it as ``enc``.

    Building a msgpack Packer per call costs more than packing a small request, so
    packers are kept, one per nesting depth.
    """

    def __init__(self):
        self.buffers = None
        self.context = None
        self.busy = False
        self._packers = []
        self._depth = 0

    def array(self, a):
        """Store ndarray ``a``; return its reference ``[dtype, shape, index-or-bytes]``."""
        dt = a.dtype
        _check_dtype(dt)
        if not a.flags.c_contiguous:
            a = np.ascontiguousarray(a)  # the only copy: non-contiguous input
        if a.nbytes < INLINE_MAX:
            return [dt.str, list(a.shape), a.tobytes()]
        external = getattr(self.context, "external_array", None)
        if external is not None:  # e.g. RPC's shared-memory path for large arrays
            where = external(a)
            if where is not None:
                return [dt.str, list(a.shape), where]
        buffers = self.buffers
        buffers.append(a.reshape(-1).view(np.uint8))
        return [dt.str, list(a.shape), len(buffers) - 1]

    def pack(self, obj):
        d = self._depth
        if d > MAX_DEPTH:  # d counts the levels above this value (the top level is 0)
            raise CodecError(f"value nests more than {MAX_DEPTH} levels of tuples, sets or "
                             "objects deep")
        if d == len(self._packers):
            self._packers.append(_mp().Packer(default=self.default, strict_types=True,
                                              autoreset=True))
        self._depth = d + 1
        try:
            return self._packers[d].pack(obj)
        finally:
            self._depth = d

    def default(self, o):
        t = type(o)
        if t is np.ndarray:
            return _ext(EXT_ARRAY, self.pack(self.array(o)))
        if t is tuple:
            return _ext(EXT_TUPLE, self.pack(list(o)))
        h = _by_type.get(t)
        if h is not None:
            return _ext(h.code, self.pack(h.encode(o, self)))
        if isinstance(o, np.ndarray):
            return _ext(EXT_ARRAY, self.pack(self.array(np.asarray(o))))
        if isinstance(o, np.generic):
            _check_dtype(o.dtype)
            return _ext(EXT_NPSCALAR, self.pack([o.dtype.str, o.tobytes()]))
        if isinstance(o, complex):
            return _ext(EXT_COMPLEX, self.pack([o.real, o.imag]))
        if isinstance(o, np.dtype):
            _check_dtype(o)
            return _ext(EXT_DTYPE, self.pack(o.str))
        if isinstance(o, int):
            if t is int:  # beyond 64 bits
                return _ext(EXT_BIGINT, str(o).encode())
            return int(o)  # bool and int subclasses (IntEnum): plain ints
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
        if isinstance(o, tuple):
            return _ext(EXT_TUPLE, self.pack(list(o)))
        if isinstance(o, (set, frozenset)):
            return _ext(EXT_SET, self.pack(list(o)))
        h = _handler_for(t)
        if h is not None:
            return _ext(h.code, self.pack(h.encode(o, self)))
        raise TypeError(f"object of type {t.__module__}.{t.__qualname__} cannot be sent or "
                        "saved (no pickling: tensors, arrays, numbers, strings, containers and "
                        "nn.Modules travel; over RPC also RRefs and functions by reference)")


_tls = threading.local()


def encode(obj, context=None):
    """Return ``(body, buffers)`` for ``obj``; ``context`` is handed to registered encoders."""
    enc = getattr(_tls, "enc", None)
    if enc is None or enc.busy:  # busy: a registered encoder that itself encodes (re-entry)
        enc = Encoder()
        if getattr(_tls, "enc", None) is None:
            _tls.enc = enc
    buffers = []
    enc.buffers, enc.context, enc.busy = buffers, context, True
    try:
        body = enc.pack(obj)
    except (OverflowError, ValueError) as e:
        if isinstance(e, CodecError):
            raise
        # msgpack's own limits: integers beyond 64 bits inside numpy types, lists
        # nested past its recursion limit
        raise CodecError(f"value cannot be encoded: {e}") from None
    finally:
        enc.buffers = enc.context = None
        enc.busy = False
        enc._depth = 0
    return body, buffers


_dtypes = {}


def _dtype(name):
    dt = _dtypes.get(name)
    if dt is None:
        if type(name) is not str:
            raise CodecError(f"malformed dtype {name!r}")
        try:
            dt = np.dtype(name)
        except TypeError as e:
            raise CodecError(f"unknown dtype {name!r}: {e}") from None
        if dt.hasobject or dt.fields is not None or dt.subdtype is not None:
            raise CodecError(f"dtype {name!r} is not accepted (no Python objects)")
        if len(_dtypes) < 256:
            _dtypes[name] = dt
    return dt


class Decoder:
    """State of one decode; registered decoders receive it as ``dec``."""

    __slots__ = ("buffers", "context", "depth", "_unpack")

    def __init__(self, buffers, context):
        self.buffers, self.context, self.depth = buffers, context, 0
        self._unpack = _mp().unpackb

    def array(self, meta):
        """The read-only array a reference made by :meth:`Encoder.array` describes."""
        if type(meta) is not list or len(meta) < 3:
            raise CodecError("malformed array reference")
        dt = _dtype(meta[0])
        shape, where = meta[1], meta[2]
        if type(shape) is not list or not all(type(s) is int and s >= 0 for s in shape):
            raise CodecError(f"malformed array shape {shape!r}")
        if type(where) is bytes:  # a small array inlined in the body
            buf = where
        elif type(where) is int and 0 <= where < len(self.buffers):
            buf = self.buffers[where]
            buf = buf.buffer if hasattr(buf, "buffer") else buf  # a zmq.Frame
        elif type(where) is list and getattr(self.context, "external_buffer", None) is not None:
            buf = self.context.external_buffer(where)  # what the encoder's external_array made
        else:
            raise CodecError(f"array buffer {where!r} does not exist")
        n = 1
        for s in shape:
            n *= s
        if len(buf) != n * dt.itemsize:
            raise CodecError(f"array data has {len(buf)} bytes, expected {n * dt.itemsize} "
                             f"for shape {tuple(shape)} of {dt}")
        a = np.frombuffer(buf, dtype=dt)
        if len(shape) != 1:
            a = a.reshape(shape)
        if a.flags.writeable:
            a.flags.writeable = False
        return a

    def resolve(self, ref):
        """The function or class that reference ``ref`` (``"module:qualname"``) names, as
        the context's ``resolve(ref)`` decides (RPC: the worker's allowlist; ``load``: the
        modules the caller allows); CodecError where the context resolves nothing."""
        resolver = getattr(self.context, "resolve", None)
        if resolver is None:
            raise CodecError("functions, classes and modules are not accepted here")
        if type(ref) is not str:
            raise CodecError("malformed function or class reference")
        return resolver(ref)

    def unpack(self, data):
        """Decode a nested msgpack payload (one more level of depth)."""
        if self.depth > MAX_DEPTH:
            raise CodecError(f"message nests more than {MAX_DEPTH} levels deep")
        self.depth += 1
        try:
            return self._unpack(data, ext_hook=self.ext_hook, raw=False, strict_map_key=False)
        finally:
            self.depth -= 1

    def ext_hook(self, code, data):
        if code == EXT_ARRAY:
            return self.array(self.unpack(data))
        if code == EXT_TUPLE:
            return tuple(self.unpack(data))
        h = _by_code.get(code)
        if h is not None:
            return h.decode(self.unpack(data), self)
        if code == EXT_NPSCALAR:
            dt, raw = self.unpack(data)
            dt = _dtype(dt)
            if type(raw) is not bytes or len(raw) != dt.itemsize:
                raise CodecError("malformed numpy scalar")
            return np.frombuffer(raw, dtype=dt)[0]
        if code == EXT_COMPLEX:
            re, im = self.unpack(data)
            return complex(re, im)
        if code == EXT_DTYPE:
            return _dtype(self.unpack(data))
        if code == EXT_BIGINT:
            if len(data) > 4096:
                raise CodecError("integer of more than 4096 digits")
            return int(data.decode())
        if code == EXT_SET:
            return set(self.unpack(data))
        raise UnknownExtensionError(code)


def decode(body, buffers=(), context=None, max_size=None):
    """Inverse of :func:`encode`: ``buffers`` are the received buffers (or zmq Frames).

    Any malformation raises :class:`CodecError`; errors a registered decoder
    raises on purpose (a refused function reference) pass through unchanged.
    """
    if max_size is not None and len(body) > max_size:
        raise CodecError(f"body of {len(body)} bytes exceeds the limit of {max_size}")
    dec = Decoder(buffers, context)
    try:
        return dec.unpack(body)
    except CodecError:
        raise
    except (ValueError, TypeError, KeyError, IndexError, OverflowError, UnicodeDecodeError,
            RecursionError, MemoryError) as e:
        raise CodecError(f"malformed data: {type(e).__name__}: {e}") from None
    except Exception as e:
        if type(e).__module__.startswith("msgpack"):
            raise CodecError(f"malformed data: {type(e).__name__}: {e}") from None
        raise


def dumps(obj, context=None):
    """``obj`` as one bytes object (body and buffers together), e.g. for a file or a blob."""
    body, buffers = encode(obj, context)
    return _mp().packb([body, [memoryview(b).cast("B") if not isinstance(b, bytes) else b
                               for b in buffers]])


def loads(data, context=None):
    """Inverse of :func:`dumps`; arrays come back read-only."""
    try:
        body, buffers = _mp().unpackb(data, raw=False, use_list=True)
    except Exception as e:  # noqa: BLE001 - any malformation is the same error here
        raise CodecError(f"not encoded data: {type(e).__name__}: {e}") from None
    if type(body) is not bytes or type(buffers) is not list \
            or not all(type(b) is bytes for b in buffers):
        raise CodecError("not encoded data: expected [body, [buffers]]")
    return decode(body, buffers, context)

"""Message framing: a msgpack header, then the value codec's body and buffers.

A message is ``[header, body, buf0, buf1, ...]`` (see PROTOCOL.md). The header is
``[version, kind, msg_id, src_rank, extra, segments]``: ``extra`` belongs to the
message interceptors, ``segments`` names the shared-memory segments the body
refers to (so a receiver can release them even when it drops the message). The body and buffers are what
:mod:`distgrad.codec` makes of the value: an array in the body is
``[dtype, shape, index]`` and its bytes are frame ``2 + index``, sent with
``copy=False`` and received as a read-only view over the frame, so no payload
is copied in Python (or ``[dtype, shape, [segment, ...]]`` when it travels
through shared memory, see ``shm.py``). Codec errors become
:class:`ProtocolError` here, on the sending side as on the receiving one.
"""
import msgpack

from .. import codec
from .errors import ProtocolError, UnknownTypeError, UnsendableError

__all__ = ["VERSION", "Kind", "pack_header", "unpack_header", "encode", "decode",
           "first_item"]

VERSION = 4  # 4: connections are authenticated and bound to a rank (PROTOCOL.md)
MAX_HEADER = 64 * 1024


class Kind:
    CALL = 1      # request: body = [target, args, kwargs, remote_ref or None]; gets REPLY or ERROR
    REPLY = 2     # response: body = value
    ERROR = 3     # response: body = [type name, module, message, traceback]
    SYSTEM = 4    # request of a short internal operation, served on the receiver's I/O thread
    LEAVE = 6     # one-way: the sender is leaving the world (body: the reason, text)
    RELEASE = 7   # one-way: shared-memory segments (named in the header) the sender released
    ALL = frozenset((CALL, REPLY, ERROR, SYSTEM, LEAVE, RELEASE))
    NAMES = {CALL: "CALL", REPLY: "REPLY", ERROR: "ERROR", SYSTEM: "SYSTEM", LEAVE: "LEAVE",
             RELEASE: "RELEASE"}


_packb = msgpack.packb
_unpackb = msgpack.unpackb


def pack_header(kind, msg_id, src_rank, extra=None, segments=None):
    return _packb([VERSION, kind, msg_id, src_rank, extra, segments])


def unpack_header(data):
    """Validate and return (kind, msg_id, src_rank, extra, segments); ProtocolError if
    malformed. ``segments`` is a list of str (empty when there are none)."""
    if len(data) > MAX_HEADER:
        raise ProtocolError(f"header of {len(data)} bytes exceeds {MAX_HEADER}")
    try:
        h = _unpackb(data, raw=False, strict_map_key=False, ext_hook=_no_ext)
    except ProtocolError:
        raise
    except Exception as e:  # noqa: BLE001 - any malformation is a protocol error
        raise ProtocolError(f"malformed header: {e}") from None
    if type(h) is not list or len(h) != 6:
        raise ProtocolError("malformed header: expected a list of 6 items")
    version, kind, msg_id, src, extra, segments = h
    if type(version) is not int or version != VERSION:
        raise ProtocolError(f"unknown protocol version {version!r} (this side speaks {VERSION})")
    if type(kind) is not int or kind not in Kind.ALL:
        raise ProtocolError(f"unknown message kind {kind!r}")
    if type(msg_id) is not int or type(src) is not int:
        raise ProtocolError("malformed header: msg_id and src must be integers")
    if segments is None:
        segments = ()
    elif type(segments) is not list or len(segments) > 4096 \
            or not all(type(s) is str and len(s) < 128 for s in segments):
        raise ProtocolError("malformed header: segments must be a list of names")
    return kind, msg_id, src, extra, segments


def _no_ext(code, data):
    raise ProtocolError(f"extension type {code} not allowed in a header")


def encode(obj, context=None):
    """Return (body bytes, list of buffers) for ``obj``; ``context`` is the codec's (the
    agent's per-message context: RRef forks, function references, shared memory)."""
    try:
        return codec.encode(obj, context)
    except codec.CodecError as e:
        raise ProtocolError(str(e)) from None
    except TypeError as e:
        if isinstance(e, UnsendableError):
            raise
        raise UnsendableError(str(e)) from None


def decode(body, frames, context=None, max_size=None):
    """Inverse of :func:`encode`; any malformation raises :class:`ProtocolError`."""
    try:
        return codec.decode(body, frames, context, max_size)
    except codec.UnknownExtensionError as e:
        raise UnknownTypeError(str(e)) from None
    except codec.CodecError as e:
        raise ProtocolError(str(e)) from None


def first_item(body):
    """The first item of the list ``body`` encodes, if it is a string (a request's
    target), read without decoding the rest; else None."""
    unpacker = msgpack.Unpacker(max_buffer_size=len(body) + 1, max_str_len=1024,
                                max_bin_len=0, max_array_len=2 ** 31 - 1, max_map_len=0,
                                max_ext_len=0)
    try:
        unpacker.feed(body)
        if unpacker.read_array_header() < 1:
            return None
        item = unpacker.unpack()
    except Exception:  # noqa: BLE001 - malformed: the caller's decode says how
        return None
    return item if type(item) is str else None

"""Message framing: a msgpack header, then the value codec's body and buffers.

A message is ``[header, body, buf0, buf1, ...]`` (see PROTOCOL.md). The header is
``[version, kind, msg_id, src_rank, extra]``. The body and buffers are what
:mod:`distgrad.codec` makes of the value: an array in the body is
``[dtype, shape, index]`` and its bytes are frame ``2 + index``, sent with
``copy=False`` and received as a read-only view over the frame, so no payload
is copied in Python. Codec errors become :class:`ProtocolError` here.
"""
import msgpack

from .. import codec
from .errors import ProtocolError

__all__ = ["VERSION", "Kind", "encode", "decode", "pack_header", "unpack_header", "Context"]

VERSION = 1
MAX_HEADER = 64 * 1024


class Kind:
    CALL = 1      # request: body = [target, args, kwargs, remote_ref or None]
    REPLY = 2     # response: body = value
    ERROR = 3     # response: body = [type name, module, message, traceback]
    PING = 4      # heartbeat probe; answered with PONG
    PONG = 5
    ALL = frozenset((1, 2, 3, 4, 5))


EXT_RREF, EXT_WORKERINFO, EXT_EXC, EXT_FUNC = 7, 8, 9, 12  # codes registered by rpc types

_packb = msgpack.packb
_unpackb = msgpack.unpackb


def pack_header(kind, msg_id, src_rank, extra=None):
    return _packb([VERSION, kind, msg_id, src_rank, extra])


def unpack_header(data):
    """Validate and return (kind, msg_id, src_rank, extra); ProtocolError if malformed."""
    if len(data) > MAX_HEADER:
        raise ProtocolError(f"header of {len(data)} bytes exceeds {MAX_HEADER}")
    try:
        h = _unpackb(data, raw=False, strict_map_key=False, ext_hook=_no_ext)
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


INLINE_MAX = codec.INLINE_MAX


class Context:
    """What the RPC layer's registered types need while a message is encoded or decoded:
    ``encode_rref(rref) -> list`` (registers a fork with the owner), ``decode_rref(meta)``
    and ``resolve(ref)`` (the allowlist check of a function reference)."""

    __slots__ = ("encode_rref", "decode_rref", "resolve")
    functions_by_reference = True  # see resolve.py: functions travel as module:qualname

    def __init__(self, encode_rref=None, decode_rref=None, resolve=None):
        self.encode_rref, self.decode_rref, self.resolve = encode_rref, decode_rref, resolve


def encode(obj, rref_encoder=None):
    """Return (body bytes, list of buffers) for ``obj``; RRefs need ``rref_encoder``."""
    try:
        return codec.encode(obj, Context(encode_rref=rref_encoder))
    except codec.CodecError as e:
        raise ProtocolError(str(e)) from None


def decode(body, frames, rref_decoder=None, resolver=None, max_size=4 << 30):
    """Inverse of :func:`encode`; any malformation raises :class:`ProtocolError`."""
    try:
        return codec.decode(body, frames, Context(decode_rref=rref_decoder, resolve=resolver),
                            max_size)
    except codec.CodecError as e:
        raise ProtocolError(str(e)) from None

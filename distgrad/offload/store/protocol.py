"""The activation store's wire protocol (client DEALER <-> store ROUTER).

A message is ``[body, *buffers]`` from :func:`distgrad.codec.encode` of a dict (the
ROUTER adds the client's routing id in front). Blobs are uint8 arrays riding as
zero-copy frames. Requests::

    {"op": "hello",   "id": n}                                 -> {"id", "name", "pid", "limits"}
    {"op": "put",     "id": n, "ns": ns, "key": k, "blob": b}  -> {"id"}
    {"op": "get",     "id": n, "ns": ns, "key": k}             -> {"id", "blob"}
    {"op": "delete",  "ns": ns, "key": k}                      (no reply)
    {"op": "release", "id": n, "ns": ns}                       -> {"id", "freed"}
    {"op": "stats",   "id": n}                                 -> {"id", "stats"}
    {"op": "bye"}                                              (no reply; frees all of the client's blobs)

A failed request is answered ``{"id", "error": message}``. Keys live per client
(the connection) and per namespace ``ns`` (an autograd context, a hook object):
a client cannot name another client's blobs. Nothing is pickled; everything a
client sends is checked here before the store acts on it.
"""
import numpy as np

from ... import codec

__all__ = ["OPS", "ProtocolError", "encode", "decode_request", "decode_reply", "MAX_BODY"]

OPS = ("hello", "put", "get", "delete", "release", "stats", "bye")
#: A request body (without its blob) is small; anything larger is refused unread.
MAX_BODY = 64 << 10
_MAX_NAME = 256


class ProtocolError(ValueError):
    """A message that does not follow the protocol."""


def encode(message):
    """Frames for ``message`` (a dict; arrays become zero-copy frames)."""
    body, buffers = codec.encode(message)
    return [body, *buffers]


def _check_name(what, value):
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise ProtocolError(f"{what} must be an int or a str, got {type(value).__name__}")
    if isinstance(value, str) and len(value) > _MAX_NAME:
        raise ProtocolError(f"{what} is longer than {_MAX_NAME} characters")
    return value


def decode_request(frames):
    """The validated request dict of a message's frames (routing id removed)."""
    if not frames:
        raise ProtocolError("empty message")
    try:
        msg = codec.decode(frames[0].bytes if hasattr(frames[0], "bytes") else frames[0],
                           frames[1:], max_size=MAX_BODY)
    except codec.CodecError as e:
        raise ProtocolError(f"undecodable request: {e}") from None
    if not isinstance(msg, dict) or msg.get("op") not in OPS:
        raise ProtocolError(f"not a request (op must be one of {', '.join(OPS)})")
    op = msg["op"]
    rid = msg.get("id")
    if op not in ("delete", "bye") and (isinstance(rid, bool) or not isinstance(rid, int)):
        raise ProtocolError(f"{op} request without an integer id")
    if op in ("put", "get", "delete", "release"):
        _check_name("ns", msg.get("ns"))
    if op in ("put", "get", "delete"):
        _check_name("key", msg.get("key"))
    if op == "put":
        blob = msg.get("blob")
        if not isinstance(blob, np.ndarray) or blob.dtype != np.uint8 or blob.ndim != 1:
            raise ProtocolError("put needs 'blob', a 1-d uint8 array")
    return msg


def decode_reply(frames):
    try:
        msg = codec.decode(frames[0].bytes if hasattr(frames[0], "bytes") else frames[0],
                           frames[1:], max_size=MAX_BODY)
    except codec.CodecError as e:
        raise ProtocolError(f"undecodable reply: {e}") from None
    if not isinstance(msg, dict) or isinstance(msg.get("id"), bool) \
            or not isinstance(msg.get("id"), int):
        raise ProtocolError("reply without an integer id")
    return msg

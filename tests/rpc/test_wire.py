"""RPC message framing: headers, and function references resolved through the allowlist."""
import msgpack
import pytest

from distgrad.rpc import wire
from distgrad.rpc.errors import ProtocolError

pytestmark = pytest.mark.timeout(60)


def test_exceptions_and_worker_info():
    from distgrad.rpc.worker_info import WorkerInfo
    body, bufs = wire.encode([ValueError("bad"), WorkerInfo("w", 3)])
    out = wire.decode(body, bufs)
    assert isinstance(out[0], ValueError) and "bad" in str(out[0])
    assert out[1] == WorkerInfo("w", 3)


def test_header_validation():
    assert wire.unpack_header(wire.pack_header(wire.Kind.CALL, 7, 1, {"ctx": 3})) == \
        (wire.Kind.CALL, 7, 1, {"ctx": 3})
    for bad in [b"", b"\xc1", msgpack.packb([99, 1, 1, 0, None]), msgpack.packb([1, 42, 1, 0, None]),
                msgpack.packb([1, 1, "x", 0, None]), msgpack.packb({"v": 1}), b"\x00" * 70000]:
        with pytest.raises(ProtocolError):
            wire.unpack_header(bad)


def test_functions_travel_by_reference_and_resolve_only_through_the_allowlist():
    from distgrad.rpc.options import DEFAULT_ALLOWED_MODULES
    from distgrad.rpc.resolve import resolve
    from distgrad.testing.rpc_funcs import echo
    body, bufs = wire.encode([echo, len])
    with pytest.raises(ProtocolError):
        wire.decode(body, bufs)
    with pytest.raises(Exception, match="allowlist"):
        wire.decode(body, bufs, resolver=lambda r: resolve(r, DEFAULT_ALLOWED_MODULES))
    body, bufs = wire.encode([echo])
    assert wire.decode(body, bufs, resolver=lambda r: resolve(r, DEFAULT_ALLOWED_MODULES)) == [echo]

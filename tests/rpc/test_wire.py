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
        (wire.Kind.CALL, 7, 1, {"ctx": 3}, ())
    assert wire.unpack_header(wire.pack_header(wire.Kind.REPLY, 7, 1, None, ["seg"]))[4] == ["seg"]
    for bad in [b"", b"\xc1", msgpack.packb([99, 1, 1, 0, None, None]),
                msgpack.packb([wire.VERSION, 42, 1, 0, None, None]),
                msgpack.packb([wire.VERSION, 1, "x", 0, None, None]), msgpack.packb({"v": 1}),
                msgpack.packb([wire.VERSION, 1, 1, 0, None]),
                msgpack.packb([wire.VERSION, 1, 1, 0, None, [1, 2]]), b"\x00" * 70000]:
        with pytest.raises(ProtocolError):
            wire.unpack_header(bad)


class _Refs:
    """A codec context that resolves function references through an allowlist."""
    functions_by_reference = True

    def __init__(self, allowlist):
        self.resolve = allowlist.resolve


def test_functions_travel_by_reference_and_resolve_only_through_the_allowlist():
    from distgrad.rpc.allowlist import Allowlist
    from support.rpc_funcs import echo
    body, bufs = wire.encode([echo, len], _Refs(Allowlist()))
    with pytest.raises(ProtocolError):
        wire.decode(body, bufs)  # no resolver: functions are not accepted
    with pytest.raises(Exception, match="allowlist"):
        wire.decode(body, bufs, _Refs(Allowlist()))
    body, bufs = wire.encode([echo], _Refs(Allowlist()))
    assert wire.decode(body, bufs, _Refs(Allowlist(["support"]))) == [echo]
    with pytest.raises(TypeError, match="cannot be sent"):
        wire.encode([echo])  # no RPC context: functions do not travel

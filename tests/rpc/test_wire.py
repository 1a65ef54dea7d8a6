import msgpack
import numpy as np
import pytest

from distgrad.rpc import wire
from distgrad.rpc.errors import ProtocolError


def roundtrip(obj):
    body, bufs = wire.encode(obj)
    return wire.decode(body, [memoryview(b) for b in bufs])


@pytest.mark.parametrize("obj", [
    None, True, False, 0, -5, 2**64 + 3, -(2**70), 1.5, float("inf"), "text", "", b"\x00bytes",
    [1, [2, 3]], (1, (2,), []), {"a": 1, 2: "two"}, 1 + 2j, {1, 2}, np.float32(2.5),
    np.int64(-3), np.bool_(True), np.dtype("float32"), {"nested": [(1, 2), {"x": (3,)}]},
])
def test_roundtrip_keeps_value_and_type(obj):
    out = roundtrip(obj)
    assert out == obj and type(out) is type(obj)


def test_tuple_and_list_stay_distinct():
    out = roundtrip([(1, 2), [1, 2], ((),)])
    assert type(out[0]) is tuple and type(out[1]) is list and out[2] == ((),)


@pytest.mark.parametrize("arr", [
    np.arange(12, dtype=np.float64).reshape(3, 4), np.zeros((0, 3), np.float32),
    np.array(7, dtype=np.int16), np.arange(20)[::3], np.ones((2, 3), np.bool_),
    np.arange(6, dtype=np.complex64), np.arange(3000, dtype=np.float64).reshape(30, 100),
    np.arange(5000, dtype=np.int32)[::2], np.ones((40, 50), np.bool_),
])
def test_arrays_travel_as_frames_and_arrive_read_only(arr):
    body, bufs = wire.encode({"a": arr})
    big = arr.nbytes >= wire.INLINE_MAX
    assert len(bufs) == int(big) and (len(body) < 100 or not big)
    out = wire.decode(body, [memoryview(b) for b in bufs])["a"]
    np.testing.assert_array_equal(out, arr)
    assert out.dtype == arr.dtype and out.shape == arr.shape
    assert not out.flags.writeable
    with pytest.raises(ValueError):
        out[...] = 0


def test_contiguous_array_is_not_copied():
    a = np.arange(1 << 16, dtype=np.float32)
    _, bufs = wire.encode(a)
    assert np.shares_memory(bufs[0], a)


def test_exceptions_and_worker_info():
    from distgrad.rpc.worker_info import WorkerInfo
    out = roundtrip([ValueError("bad"), WorkerInfo("w", 3)])
    assert isinstance(out[0], ValueError) and "bad" in str(out[0])
    assert out[1] == WorkerInfo("w", 3)


def test_tensor_roundtrip():
    Tensor = pytest.importorskip("distgrad.autograd.tensor").Tensor
    t = Tensor._wrap(np.arange(4.0), requires_grad=True)
    out = roundtrip((t,))[0]
    assert isinstance(out, Tensor) and out.requires_grad
    np.testing.assert_array_equal(out._data, np.arange(4.0))


@pytest.mark.parametrize("obj", [object(), lambda: 1, np.array([object()]), [1, {2: object()}]])
def test_unknown_types_raise_type_error_naming_the_type(obj):
    with pytest.raises(TypeError, match="cannot|dtype"):
        wire.encode(obj)


@pytest.mark.parametrize("body", [
    b"\xc1", b"\x92\x01", msgpack.packb(msgpack.ExtType(99, b"x")),
    msgpack.packb(msgpack.ExtType(wire.EXT_ARRAY, msgpack.packb(["<f8", [4], 0]))),
    msgpack.packb(msgpack.ExtType(wire.EXT_ARRAY, msgpack.packb(["|O", [1], 0]))),
])
def test_malformed_bodies_raise_protocol_error(body):
    with pytest.raises(ProtocolError):
        wire.decode(body, [memoryview(b"\x00" * 8)])


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

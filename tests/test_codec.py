"""The value codec: every type it knows round-trips; malformed or hostile data is refused."""
import msgpack
import numpy as np
import pytest

from distgrad import codec

pytestmark = pytest.mark.timeout(60)


def roundtrip(obj):
    body, bufs = codec.encode(obj)
    return codec.decode(body, [memoryview(b) for b in bufs])


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
    body, bufs = codec.encode({"a": arr})
    big = arr.nbytes >= codec.INLINE_MAX
    assert len(bufs) == int(big) and (len(body) < 100 or not big)
    out = codec.decode(body, [memoryview(b) for b in bufs])["a"]
    np.testing.assert_array_equal(out, arr)
    assert out.dtype == arr.dtype and out.shape == arr.shape
    assert not out.flags.writeable
    with pytest.raises(ValueError):
        out[...] = 0


def test_contiguous_array_is_not_copied():
    a = np.arange(1 << 16, dtype=np.float32)
    _, bufs = codec.encode(a)
    assert np.shares_memory(bufs[0], a)


def test_tensor_roundtrip():
    Tensor = pytest.importorskip("distgrad.autograd.tensor").Tensor
    t = Tensor._wrap(np.arange(4.0), requires_grad=True)
    out = roundtrip((t,))[0]
    assert isinstance(out, Tensor) and out.requires_grad
    np.testing.assert_array_equal(out._data, np.arange(4.0))


@pytest.mark.parametrize("obj", [object(), lambda: 1, np.array([object()]), [1, {2: object()}]])
def test_unknown_types_raise_type_error_naming_the_type(obj):
    with pytest.raises(TypeError, match="cannot|dtype"):
        codec.encode(obj)


@pytest.mark.parametrize("body", [
    b"\xc1", b"\x92\x01", msgpack.packb(msgpack.ExtType(99, b"x")),
    msgpack.packb(msgpack.ExtType(codec.EXT_ARRAY, msgpack.packb(["<f8", [4], 0]))),
    msgpack.packb(msgpack.ExtType(codec.EXT_ARRAY, msgpack.packb(["|O", [1], 0]))),
])
def test_malformed_bodies_raise_codec_error(body):
    with pytest.raises(codec.CodecError):
        codec.decode(body, [memoryview(b"\x00" * 8)])


def test_nesting_beyond_the_limit_is_refused_by_the_sender_and_the_receiver():
    deep = ()
    for _ in range(codec.MAX_DEPTH + 5):
        deep = (deep,)
    with pytest.raises(codec.CodecError, match="levels"):
        codec.encode(deep)
    ok = ()
    for _ in range(codec.MAX_DEPTH - 1):
        ok = (ok,)
    assert roundtrip(ok) == ok
    # a hand-made body 1000 tuples deep (5 KB) must not overflow the decoder's stack
    body = msgpack.packb(())
    for _ in range(1000):
        body = msgpack.packb(msgpack.ExtType(codec.EXT_TUPLE, body))
    with pytest.raises(codec.CodecError, match="levels"):
        codec.decode(body)


def test_decode_refuses_a_body_over_the_size_limit_before_reading_it():
    body, _ = codec.encode(list(range(100)))
    with pytest.raises(codec.CodecError, match="limit"):
        codec.decode(body, max_size=10)


def test_registered_types_travel_and_subclasses_use_the_base_registration():
    class Point:
        def __init__(self, x, y):
            self.x, self.y = x, y

    class Point3(Point):
        pass

    codec.register(Point, 100, lambda p, enc: [p.x, (p.y,)], lambda pl, dec: Point(pl[0], pl[1][0]))
    try:
        out = roundtrip([Point(1, 2), Point3(3, 4)])
        assert [(p.x, p.y) for p in out] == [(1, 2), (3, 4)]
        with pytest.raises(ValueError, match="taken"):
            codec.register(Point3, 100, None, None)
    finally:
        codec._by_code.pop(100)
        codec._registered[:] = [h for h in codec._registered if h.code != 100]
        codec._by_type.clear()
        for h in codec._registered:
            for c in h.cls:
                codec._by_type[c] = h


def test_dumps_and_loads_keep_arrays_and_tensors():
    from distgrad.autograd.tensor import Tensor
    obj = {"w": Tensor._wrap(np.arange(3000.0)), "meta": ("x", 1)}
    out = codec.loads(codec.dumps(obj))
    np.testing.assert_array_equal(out["w"]._data, np.arange(3000.0))
    assert out["meta"] == ("x", 1)
    for bad in [b"", b"\xc1", msgpack.packb([1, 2])]:
        with pytest.raises(codec.CodecError):
            codec.loads(bad)


def test_functions_and_rrefs_are_refused_without_an_rpc_context():
    for fn in (len, np.add, roundtrip):
        with pytest.raises(TypeError, match="cannot be sent or saved"):
            codec.encode([fn])

"""Record files: the bytes of one offloaded buffer, with a header and a checksum.

Layout of a record file::

    b"DGREC\\x00\\x01\\x00"   magic and format version (8 bytes)
    u32 little-endian        length of the header
    header                   codec.dumps({"key", "nbytes", "crc32", "offset"})
    zero padding
    payload                  at ``offset``: a multiple of the page size plus ``align``

The payload starts at ``align`` bytes past a page boundary so that a memory map of
the file puts it at the same address alignment (mod 64) as the buffer it came
from, and a plain read lands in a buffer aligned the same way: NumPy's SIMD loops
then see the same alignment as without offloading. The writer keeps ``(nbytes,
crc32)`` in memory as well, and a read checks header, size and checksum against
both, so a torn, truncated or overwritten file is a :class:`CorruptRecordError`
naming the file, never a wrong tensor.
"""
import mmap
import os
import struct
import zlib

import numpy as np

from .. import codec
from .errors import CorruptRecordError

__all__ = ["ALIGN", "RecordInfo", "write_record", "read_record", "aligned_empty", "checksum"]

MAGIC = b"DGREC\x00\x01\x00"
ALIGN = 64
_PAGE = mmap.PAGESIZE
_LEN = struct.Struct("<I")
_MAX_HEADER = 4096


def checksum(buf):
    """CRC-32 of a buffer (zlib releases the GIL on large inputs)."""
    return zlib.crc32(buf) & 0xFFFFFFFF


class RecordInfo:
    """What the writer remembers about a record file (and checks on every read)."""

    __slots__ = ("path", "key", "nbytes", "crc32", "offset", "align")

    def __init__(self, path, key, nbytes, crc32, offset, align):
        self.path, self.key, self.nbytes, self.crc32 = path, key, nbytes, crc32
        self.offset, self.align = offset, align


def aligned_empty(nbytes, align=0):
    """A writable uint8 array of ``nbytes`` whose address is ``align`` mod :data:`ALIGN`."""
    raw = np.empty(nbytes + ALIGN, dtype=np.uint8)
    start = (align - raw.ctypes.data) % ALIGN
    return raw[start:start + nbytes]


def write_record(path, key, payload, align=0):
    """Write ``payload`` (a uint8 array) as record ``key``; return its :class:`RecordInfo`."""
    nbytes = int(payload.nbytes)
    crc = checksum(payload)
    header = codec.dumps({"key": key, "nbytes": nbytes, "crc32": crc, "offset": 0})
    lead = len(MAGIC) + _LEN.size + len(header) + 16  # room for the offset's own digits
    offset = -(-lead // _PAGE) * _PAGE + align % ALIGN
    header = codec.dumps({"key": key, "nbytes": nbytes, "crc32": crc, "offset": offset})
    head = MAGIC + _LEN.pack(len(header)) + header
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        _write_all(fd, head + bytes(offset - len(head)))
        _write_all(fd, memoryview(payload).cast("B") if nbytes else b"")
    finally:
        os.close(fd)
    return RecordInfo(path, key, nbytes, crc, offset, align % ALIGN)


def _write_all(fd, data):
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        view = view[n:]


def read_record(info, use_mmap=False):
    """The payload of the record ``info`` describes, read-only, verified."""
    try:
        fd = os.open(info.path, os.O_RDONLY)
    except OSError as e:
        raise CorruptRecordError(f"offloaded record {info.path} cannot be opened: {e}") from None
    try:
        size = os.fstat(fd).st_size
        if size != info.offset + info.nbytes:
            raise CorruptRecordError(
                f"offloaded record {info.path} has {size} bytes, expected "
                f"{info.offset + info.nbytes} (torn or overwritten)")
        _check_header(info, os.pread(fd, min(info.offset, _MAX_HEADER + 16), 0))
        if use_mmap and info.nbytes:
            mm = mmap.mmap(fd, size, prot=mmap.PROT_READ,
                           flags=mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0))
            out = np.frombuffer(mm, dtype=np.uint8, count=info.nbytes, offset=info.offset)
        else:
            out = aligned_empty(info.nbytes, info.align)
            _read_all(fd, out, info)
    finally:
        os.close(fd)
    if checksum(out) != info.crc32:
        raise CorruptRecordError(
            f"offloaded record {info.path} fails its checksum (the file was changed after it "
            "was written)")
    out.flags.writeable = False
    return out


def _read_all(fd, out, info):
    view, pos = memoryview(out), info.offset
    while view:
        got = os.preadv(fd, [view], pos)
        if got <= 0:
            raise CorruptRecordError(f"offloaded record {info.path} ends early (at byte {pos})")
        view, pos = view[got:], pos + got


def _check_header(info, head):
    n = len(MAGIC) + _LEN.size
    if len(head) < n or head[:len(MAGIC)] != MAGIC:
        raise CorruptRecordError(f"offloaded record {info.path} is not a record file (bad magic)")
    (hlen,) = _LEN.unpack_from(head, len(MAGIC))
    if hlen > len(head) - n:
        raise CorruptRecordError(f"offloaded record {info.path} has a torn header")
    try:
        header = codec.loads(head[n:n + hlen])
    except codec.CodecError as e:
        raise CorruptRecordError(f"offloaded record {info.path} has a bad header: {e}") from None
    expected = {"key": info.key, "nbytes": info.nbytes, "crc32": info.crc32, "offset": info.offset}
    if header != expected:
        raise CorruptRecordError(
            f"offloaded record {info.path} holds {header}, expected {expected} (overwritten)")

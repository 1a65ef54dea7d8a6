"""Tensors in shared memory: ``Tensor.share_memory_()``, ``is_shared()``, and how tensors
cross :mod:`multiprocessing` (``torch.multiprocessing.reductions``).

A shared tensor's array lives in a *segment*: an anonymous memory file
(``memfd_create`` on Linux; elsewhere a POSIX shared-memory object unlinked at
once) mapped into the process. The file has no name in ``/dev/shm``, so nothing
can leak there: the kernel frees the memory when the last process that maps it
unmaps it or exits, however it exits (a crash, SIGKILL). Each process keeps the
segment's file descriptor open while any array maps it, so it can hand the
segment on to processes it starts.

Moving a tensor into shared memory (``share_memory_()``, ``Module.share_memory()``)
copies its bytes into a new segment and points the tensor at them, as PyTorch
moves a storage: every *tensor* that shares those bytes (views, ``.data``,
``detach()`` aliases, found by address) is moved with it, so they stay one
buffer. Other holders of the old bytes (NumPy arrays from ``from_numpy`` or
``.numpy()``) keep the old memory, as in PyTorch, and a warning says so.

Crossing processes follows PyTorch: a tensor pickled by :mod:`multiprocessing`
(the arguments of a ``spawn``/``forkserver`` child, a ``Queue``, a ``Pipe``) is
moved into shared memory first and travels as a handle (the segment's file
descriptor, passed by the kernel, plus offset, shape, strides and dtype); the
receiver maps the same bytes, so both processes see each other's in-place
updates. A ``fork`` child inherits the parent's mappings: tensors shared before
the fork are shared with it, others are copy-on-write copies (as in PyTorch).
Only this path uses pickle, and only between a process and the ones it starts
or is started by (see :mod:`distgrad.multiprocessing`); nothing arriving over a
socket is unpickled. A non-leaf tensor that requires grad refuses to travel,
with PyTorch's message.

>>> import distgrad
>>> t = distgrad.zeros(3)
>>> t.is_shared()
False
>>> t.share_memory_() is t, t.is_shared()
(True, True)
"""
import bisect
import gc
import mmap
import os
import secrets
import sys
import warnings
import weakref
from multiprocessing.context import get_spawning_popen
from multiprocessing.reduction import DupFd, ForkingPickler

import numpy as np

from ..autograd._internal import TensorBase, array_of, mark_requires_grad, set_array, wrap

__all__ = ["share_memory", "is_shared", "SharedSegment", "SharingMethods"]

_ALIGN = 64  # bytes: every array of a segment starts on a cache line


class SharedSegment(mmap.mmap):
    """One shared-memory file mapped here; ``fd`` stays open while the mapping lives."""

    def __new__(cls, fd, size):
        segment = super().__new__(cls, fd, size)
        segment.fd = fd
        segment.key = _file_key(fd)
        weakref.finalize(segment, os.close, fd)
        return segment


def _file_key(fd):
    st = os.fstat(fd)
    return st.st_dev, st.st_ino


# The segments mapped in this process, by file identity: a segment received twice
# (two tensors of one model, two messages) is mapped once.
_mapped = weakref.WeakValueDictionary()


def _anonymous_file(size):
    """A file descriptor of ``size`` bytes of shared memory that has no name anywhere."""
    if hasattr(os, "memfd_create"):
        fd = os.memfd_create("distgrad-shared", os.MFD_CLOEXEC)
    else:  # macOS, BSDs: a POSIX shared-memory object, unlinked before anyone can see it
        import _posixshmem
        name = f"/distgrad-{os.getpid()}-{secrets.token_hex(8)}"
        fd = _posixshmem.shm_open(name, os.O_CREAT | os.O_EXCL | os.O_RDWR, mode=0o600)
        _posixshmem.shm_unlink(name)
        os.set_inheritable(fd, False)
    try:
        os.ftruncate(fd, size)
    except OSError:
        os.close(fd)
        raise
    return fd


def _new_segment(size):
    size = max(size, 1)  # mmap refuses empty mappings
    fd = _anonymous_file(size)
    try:
        segment = SharedSegment(fd, size)
    except BaseException:
        os.close(fd)
        raise
    _mapped[segment.key] = segment
    return segment


def _attach(fd):
    """The segment behind a received file descriptor, mapped once per process."""
    key = _file_key(fd)
    segment = _mapped.get(key)
    if segment is not None:
        if fd != segment.fd:
            os.close(fd)  # a second descriptor of a file mapped already
        return segment
    segment = SharedSegment(fd, os.fstat(fd).st_size)
    _mapped[key] = segment
    return segment


def _owners(array):
    """The objects whose memory ``array`` uses: the array, the arrays it views, and the
    buffer they all view (a segment, a bytearray, ...)."""
    chain = [array]
    obj = array
    while True:
        nxt = obj.base if isinstance(obj, np.ndarray) else (
            obj.obj if isinstance(obj, memoryview) else None)
        if nxt is None:
            return chain
        chain.append(nxt)
        obj = nxt


def _segment_of(array):
    owner = _owners(array)[-1]
    return owner if isinstance(owner, SharedSegment) else None


def is_shared(tensor):
    """Whether ``tensor``'s array lives in a shared-memory segment."""
    return _segment_of(array_of(tensor)) is not None


def _check_dense(t):
    if getattr(t, "is_sparse", False) is True or not isinstance(array_of(t), np.ndarray):
        raise RuntimeError(f"share_memory_(): a {type(t).__name__} whose data is not one dense "
                           "array cannot be moved into shared memory by distgrad")


def _bounds(array):
    """[low, high) addresses of the bytes ``array`` uses."""
    low = high = array.__array_interface__["data"][0]
    if array.size == 0:
        return low, high
    for n, stride in zip(array.shape, array.strides):
        if stride < 0:
            low += (n - 1) * stride
        else:
            high += (n - 1) * stride
    return low, high + array.itemsize


def _unexplained_references(tensors):
    """Per array that ``tensors`` use, how many references to it are not theirs (other
    tensors, NumPy views, ``numpy()`` results); and whether a buffer that is not an array
    (a bytearray, a memoryview) is among what they use. Such buffers are not counted: the
    other arrays over them may view other bytes."""
    objects, expected = _expected_references(tensors)
    counts = _reference_counts(objects)
    unexplained = {key: counts[key] - _BASELINE - expected[key] for key in counts
                   if counts[key] - _BASELINE > expected[key]}
    foreign = any(not isinstance(o, (np.ndarray, SharedSegment)) for o in objects.values())
    return unexplained, foreign


def _reference_counts(objects):
    """sys.getrefcount of each array of ``objects``; a baseline of them (``objects``'s
    own, the call's) is measured once, below, rather than assumed."""
    return {key: sys.getrefcount(objects[key]) for key in objects
            if isinstance(objects[key], np.ndarray)}


def _expected_references(tensors):
    """{id: object} of the arrays and buffers ``tensors`` use, and {id: references} that
    they explain: one per tensor holding the array, one per distinct array viewing it."""
    objects, expected = {}, {}

    def count(obj):
        known = id(obj) in objects
        objects[id(obj)] = obj
        expected[id(obj)] = expected.get(id(obj), 0) + 1
        return known

    for t in tensors:
        chain = _owners(array_of(t))
        if count(chain[0]):
            continue  # another tensor holds this very array: its chain is counted
        for parent in chain[1:]:
            if count(parent):
                break
    return objects, expected


# What _reference_counts reports for an array that only the ``objects`` dict holds.
_BASELINE = _reference_counts({0: np.empty(1)})[0]


def _tensors_overlapping(tensors):
    """Every live tensor (besides ``tensors``) whose bytes overlap theirs, transitively."""
    known = {id(t) for t in tensors}
    spans = [_bounds(array_of(t)) for t in tensors]
    candidates = []
    for obj in gc.get_objects():
        # type(), not isinstance: some objects answer __class__ lookups with warnings
        if issubclass(type(obj), TensorBase) and id(obj) not in known \
                and isinstance(array_of(obj), np.ndarray) and _segment_of(array_of(obj)) is None:
            candidates.append((obj, _bounds(array_of(obj))))
    found, grew = [], True
    while grew:
        grew = False
        for i, (t, (lo, hi)) in enumerate(candidates):
            if t is not None and any(lo < h and l < hi or lo == l for l, h in spans):
                found.append(t)
                spans.append((lo, hi))
                candidates[i] = (None, (0, 0))
                grew = True
    return found


def _regions(spans):
    """Merge overlapping address ranges: [(lo, hi)], sorted."""
    merged = []
    for lo, hi in sorted(spans):
        if merged and lo < merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], hi)
        else:
            merged.append([lo, hi])
    return merged


def share_memory(tensors):
    """Move the arrays of ``tensors`` (and of every tensor sharing their bytes) into one
    new shared-memory segment, in place; already shared ones are left alone.

    Raises ``RuntimeError`` for a tensor whose data is not one dense array (nothing is
    moved then).
    """
    batch, seen = [], set()
    for t in tensors:
        if id(t) not in seen and not is_shared(t):
            _check_dense(t)
            seen.add(id(t))
            batch.append(t)
    if not batch:
        return
    unexplained, foreign = _unexplained_references(batch)
    if unexplained or foreign:
        batch += _tensors_overlapping(batch)
        unexplained, _ = _unexplained_references(batch)
    if unexplained:
        shapes = ", ".join(str(list(t.shape)) for t in batch[:4])
        warnings.warn(f"share_memory_(): {sum(unexplained.values())} reference(s) to the memory "
                      f"of the tensor(s) of shape {shapes} are not tensors (NumPy arrays from "
                      "from_numpy() or numpy(), ...); they keep the old, unshared memory, as "
                      "in PyTorch", RuntimeWarning, stacklevel=3)
    spans = [_bounds(array_of(t)) for t in batch]
    regions = _regions(spans)
    placement, size = [], 0
    for lo, hi in regions:
        placement.append(size)
        size += -(-(hi - lo) // _ALIGN) * _ALIGN or _ALIGN
    segment = _new_segment(size)
    starts = [lo for lo, _ in regions]
    for t, (lo, _) in zip(batch, spans):
        old = array_of(t)
        i = _region_index(starts, lo)
        address = old.__array_interface__["data"][0]
        offset = placement[i] + (address - starts[i])
        new = np.ndarray(old.shape, old.dtype, buffer=segment, offset=offset,
                         strides=old.strides)
        np.copyto(new, old, casting="no")
        new.flags.writeable = old.flags.writeable
        set_array(t, new)


def _region_index(starts, lo):
    return bisect.bisect_right(starts, lo) - 1


# --------------------------------------------------------------- crossing processes
def _rebuild_tensor(cls, handle, offset, shape, strides, dtype, writeable, requires_grad):
    segment = _attach(handle.detach())
    array = np.ndarray(tuple(shape), np.dtype(dtype), buffer=segment, offset=offset,
                       strides=tuple(strides))
    array.flags.writeable = writeable
    t = wrap(array, cls=cls)
    mark_requires_grad(t, requires_grad)
    return t


def _reduce_tensor(t):
    if t.requires_grad and t.grad_fn is not None:
        raise RuntimeError("Cowardly refusing to serialize non-leaf tensor which requires_grad, "
                           "since autograd does not support crossing process boundaries.  If you "
                           "just want to transfer the data, call detach() on the tensor before "
                           "serializing (e.g., putting it on the queue).")
    share_memory([t])
    array = array_of(t)
    segment = _segment_of(array)
    offset = array.__array_interface__["data"][0] - _address(segment)
    return (_rebuild_tensor, (type(t), _handle(segment), offset, array.shape, array.strides,
                              array.dtype.str, bool(array.flags.writeable),
                              bool(t.requires_grad)))


# The handles made for the child being started, per file descriptor: the child gets
# each descriptor once, however many tensors of its segment travel.
_spawning_handles = weakref.WeakKeyDictionary()


def _handle(segment):
    """What carries ``segment``'s descriptor: handed to the child being started (spawn,
    forkserver), or, later (a Queue, a Pipe), served to the receiver by this process."""
    popen = get_spawning_popen()
    if popen is None:
        return DupFd(segment.fd)
    handles = _spawning_handles.setdefault(popen, {})
    if segment.fd not in handles:
        handles[segment.fd] = DupFd(segment.fd)
    return handles[segment.fd]


def _address(segment):
    return np.frombuffer(segment, np.uint8, count=1).__array_interface__["data"][0]


class SharingMethods:
    """A Tensor's shared memory: ``share_memory_()``, ``is_shared()``, and how every Tensor
    class crosses :mod:`multiprocessing` (a base of ``distgrad.Tensor``)."""

    __slots__ = ()

    def __init_subclass__(cls, **kwargs):
        # Pickling dispatches on the exact type: distgrad.Tensor itself, nn.Parameter and a
        # program's own subclasses cross processes the same way.
        ForkingPickler.register(cls, _reduce_tensor)
        super().__init_subclass__(**kwargs)

    def share_memory_(self):
        """Move this tensor's data into shared memory (no-op if it is there); returns ``self``."""
        share_memory([self])
        return self

    def is_shared(self):
        """Whether this tensor's data is in shared memory (``share_memory_()``, or received
        from another process through :mod:`distgrad.multiprocessing`)."""
        return is_shared(self)

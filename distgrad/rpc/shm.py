"""Same-host fast path: large arrays travel through shared memory instead of the socket.

As TensorPipe's shared-memory channel does for tensors: the sender copies a
large array once into a segment of its pool (a file in ``/dev/shm`` whose name
carries the sender's pid), the message names the segment, and the receiver maps
it read-only and hands out a view, so nothing is copied out. When the
receiver's last view of it is gone, the receiver sends a RELEASE message and the
sender reuses the segment. Reuse matters: the first write to a fresh tmpfs page
costs a page fault, which on a virtual machine makes a fresh 64 MB segment ~10x
slower to fill than a warm one.

The path is used toward a peer only after it proved it can map a segment this
process made (:meth:`SegmentPool.probe` / :meth:`SegmentMaps.check_probe`): two
containers can share a hostname without sharing ``/dev/shm``. Otherwise, and
for small arrays, the ZeroMQ path is used, with no error.

Lifetimes, including crashes:

* a segment is lent to one receiver at a time and never written while lent;
  a receiver that dies or leaves gives its segments back (:meth:`reclaim`);
* the receiver releases every segment a message named, also when it drops the
  message (a late reply, a malformed body): the names ride in the header;
* the sender unlinks its files when it shuts down; a sender that is killed
  leaves files that the next process to start sweeps (owner pid in the name,
  :mod:`distgrad.utils.tempdirs`); mappings held by receivers stay valid until
  their views are gone.
"""
import collections
import logging
import mmap
import os
import re
import secrets
import threading
import time
import weakref

import numpy as np

from .. import codec
from ..utils.tempdirs import owned_name, sweep_stale
from .wire import Kind, pack_header

__all__ = ["SegmentPool", "SegmentMaps", "SameHost", "LendingContext", "shm_root", "PREFIX"]

log = logging.getLogger("distgrad.rpc")

PREFIX = "dgshm-"
_NAME = re.compile(r"^dgshm-(\d+)-[0-9a-f]{8}-(\d+)$")
_MIN_SEGMENT = 1 << 20


def shm_root():
    """The shared-memory directory, or None where there is none (then the path is off)."""
    root = "/dev/shm"
    return root if os.path.isdir(root) and os.access(root, os.W_OK) else None


class _Segment:
    __slots__ = ("name", "size", "map", "array", "lent_to", "used")

    def __init__(self, name, size, m):
        self.name, self.size, self.map = name, size, m
        self.array = np.frombuffer(m, dtype=np.uint8)
        self.lent_to = None
        self.used = 0.0


class SegmentPool:
    """The sending side: warm segments lent to receivers, one array each."""

    def __init__(self, root, threshold, max_bytes, keep_bytes=None):
        self.root, self.threshold, self.max_bytes = root, threshold, max_bytes
        self.keep_bytes = max_bytes // 4 if keep_bytes is None else keep_bytes
        self._prefix = owned_name(PREFIX) + secrets.token_hex(4) + "-"
        self._counter = 0
        self._lock = threading.Lock()
        self._segments = {}    # name -> _Segment
        self._bytes = 0
        self._closed = False
        sweep_stale(PREFIX, root)

    def _create(self, size):  # with the lock held
        self._counter += 1
        name = f"{self._prefix}{self._counter}"
        path = os.path.join(self.root, name)
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_RDWR | os.O_NOFOLLOW, 0o600)
        try:
            os.ftruncate(fd, size)
            m = mmap.mmap(fd, size)
        except BaseException:
            os.unlink(path)
            raise
        finally:
            os.close(fd)
        seg = self._segments[name] = _Segment(name, size, m)
        self._bytes += size
        return seg

    def lend(self, a, dst):
        """Copy ``a`` (contiguous) into a segment lent to ``dst``; return its name, or None
        when the pool is full (the caller then sends the bytes over the socket)."""
        n = a.nbytes
        with self._lock:
            if self._closed:
                return None
            best = None
            for seg in self._segments.values():  # best fit among free segments, up to 2x
                if seg.lent_to is None and n <= seg.size <= 2 * max(n, _MIN_SEGMENT) \
                        and (best is None or seg.size < best.size):
                    best = seg
            if best is None:
                size = max(_MIN_SEGMENT, 1 << (n - 1).bit_length())
                if self._bytes + size > self.max_bytes:
                    self._trim(0)
                    if self._bytes + size > self.max_bytes:
                        return None
                try:
                    best = self._create(size)
                except OSError as e:  # /dev/shm full: the socket path still works
                    log.debug("shared memory segment of %d bytes not created: %s", size, e)
                    return None
            best.lent_to = dst
        best.array[:n] = a.reshape(-1).view(np.uint8)  # the one copy; nobody else touches it
        return best.name

    def release(self, names, src):
        """``src`` no longer maps these segments: they are free again (if it held them)."""
        with self._lock:
            for name in names:
                seg = self._segments.get(name) if type(name) is str else None
                if seg is not None and seg.lent_to == src:
                    seg.lent_to = None
                    seg.used = time.monotonic()
            self._trim(self.keep_bytes)

    def reclaim(self, dst):
        """``dst`` died or left: whatever it held is free."""
        self.release([s.name for s in list(self._segments.values()) if s.lent_to == dst], dst)

    def _trim(self, keep):  # with the lock held: free segments beyond ``keep`` bytes go
        free = sorted((s for s in self._segments.values() if s.lent_to is None),
                      key=lambda s: s.used)
        free_bytes = sum(s.size for s in free)
        for seg in free:
            if free_bytes <= keep:
                break
            free_bytes -= seg.size
            self._drop(seg)

    def _drop(self, seg):
        del self._segments[seg.name]
        self._bytes -= seg.size
        seg.array = None
        try:
            seg.map.close()
        except BufferError:  # a view still exported (only while copying): leave it to GC
            pass
        try:
            os.unlink(os.path.join(self.root, seg.name))
        except OSError:
            pass

    def stats(self):
        with self._lock:
            lent = sum(1 for s in self._segments.values() if s.lent_to is not None)
            return {"segments": len(self._segments), "bytes": self._bytes, "lent": lent}

    def close(self):
        with self._lock:
            self._closed = True
            for seg in list(self._segments.values()):
                self._drop(seg)

    # -------------------------------------------------------------- the handshake
    def probe(self):
        """A small segment with a random token: (name, token). Delete with :meth:`end_probe`."""
        token = secrets.token_hex(16)
        with self._lock:
            seg = self._create(4096)
        seg.array[:len(token)] = np.frombuffer(token.encode(), dtype=np.uint8)
        return seg.name, token

    def end_probe(self, name):
        with self._lock:
            seg = self._segments.get(name)
            if seg is not None:
                self._drop(seg)


class SegmentMaps:
    """The receiving side: segments of peers mapped read-only, views handed out.

    ``on_release(src, [names])`` is called (from any thread) when the last view of
    a segment is gone, or at once for segments of a message that was dropped.
    """

    def __init__(self, root, on_release, max_mapped_bytes):
        self.root, self.on_release, self.max_mapped = root, on_release, max_mapped_bytes
        self._lock = threading.Lock()
        self._maps = {}        # name -> mmap (kept for reuse; views keep it alive)
        self._mapped_bytes = 0
        self._pids = {}        # peer rank -> pid (proved by the probe)

    def check_probe(self, src, pid, name, token):
        """Runs for a peer's probe: can this process read what ``src`` (``pid``) wrote?"""
        if not self._valid(name, pid):
            return False
        try:
            fd = os.open(os.path.join(self.root, name), os.O_RDONLY | os.O_NOFOLLOW)
            try:
                data = os.read(fd, len(token))
            finally:
                os.close(fd)
        except OSError:
            return False
        if data != token.encode():
            return False
        self._pids[src] = pid
        return True

    @staticmethod
    def _valid(name, pid):
        m = _NAME.match(name) if type(name) is str else None
        return m is not None and int(m.group(1)) == pid

    def view(self, name, nbytes, src):
        """A read-only uint8 array over ``nbytes`` of segment ``name`` lent by ``src``."""
        pid = self._pids.get(src)
        if pid is None or not self._valid(name, pid) or type(nbytes) is not int or nbytes < 0:
            raise ValueError(f"shared-memory segment {name!r} is not one rank {src} may lend")
        with self._lock:
            m = self._maps.get(name)
        if m is None:
            fd = os.open(os.path.join(self.root, name), os.O_RDONLY | os.O_NOFOLLOW)
            try:
                size = os.fstat(fd).st_size
                m = mmap.mmap(fd, size, prot=mmap.PROT_READ)
            finally:
                os.close(fd)
            with self._lock:
                self._maps[name] = m
                self._mapped_bytes += size
                self._evict()
        if nbytes > len(m):
            raise ValueError(f"shared-memory segment {name!r} holds {len(m)} bytes, not {nbytes}")
        v = np.frombuffer(m, dtype=np.uint8, count=nbytes)
        weakref.finalize(v, self.on_release, src, [name])
        return v

    def _evict(self):  # with the lock held: forget the oldest mappings beyond the budget
        while self._mapped_bytes > self.max_mapped and len(self._maps) > 1:
            name = next(iter(self._maps))
            self._mapped_bytes -= len(self._maps.pop(name))  # views keep the mmap alive

    def settle(self, src, names, mapped):
        """After a message from ``src``: release its segments that were not mapped."""
        rest = [n for n in names if n not in mapped]
        if rest:
            self.on_release(src, rest)

    def forget(self, src):
        """``src`` died or left: drop its mappings (views in use stay valid)."""
        pid = self._pids.pop(src, None)
        if pid is None:
            return
        with self._lock:
            for name in [n for n in self._maps if _NAME.match(n) and int(_NAME.match(n).group(1)) == pid]:
                self._mapped_bytes -= len(self._maps.pop(name))

    def close(self):
        with self._lock:
            self._maps.clear()
            self._mapped_bytes = 0


class SameHost:
    """One process's same-host path toward its peers: the pool it lends from, the maps of
    what peers lent it, the peers proven to share memory, and the releases waiting to be
    sent. Every method is a no-op when the path is off (no ``/dev/shm``, a threshold of 0,
    a world of one), so its users need not ask.

    ``wake()`` is called (from any thread) when a release is queued; the owner of the
    sockets then calls :meth:`send_releases`.
    """

    def __init__(self, threshold, pool_bytes, wake, enabled=True):
        root = shm_root() if enabled and threshold > 0 else None
        self.pool = SegmentPool(root, threshold, pool_bytes) if root else None
        self.maps = SegmentMaps(root, self._queue_release, 2 * pool_bytes) if root else None
        self.peers = set()  # ranks that proved they map this process's segments
        self._asked = set()  # ranks asked (or about to be asked) to map a probe
        self._wanted = collections.deque()  # of those, the ones to ask at the next tick
        self._releases = collections.deque()
        self._wake = wake
        self._closed = False

    @property
    def on(self):
        return self.pool is not None

    # -- the handshake --
    def probe(self):
        """``(pid, segment name, token)`` to send a peer, or None when the path is off."""
        if self.pool is None:
            return None
        try:
            name, token = self.pool.probe()
        except OSError as e:
            log.debug("no shared memory: %s", e)
            return None
        return os.getpid(), name, token

    def want(self, rank):
        """(any thread) An array large enough to lend goes to ``rank``, not proven to share
        memory: it takes the socket, and ``rank`` is asked once (at the I/O thread's next
        tick, :meth:`probe_wanted`) to map a probe. Peers are probed on first need, not when
        the world forms: a process makes no connection, and no segment, for a peer it never
        sends a large array to."""
        if rank in self._asked:
            return
        self._asked.add(rank)
        self._wanted.append(rank)
        self._wake()

    def probe_wanted(self, caller):
        """(the I/O thread) Send each wanted peer a probe with ``caller``; lend to those that
        map it (:meth:`probed`)."""
        while self._wanted:
            rank = self._wanted.popleft()
            probe = self.probe()
            if probe is None:
                continue
            fut = caller.call(rank, "@shm.probe", probe, internal=True)
            fut._add_inline_callback(lambda f, r=rank, p=probe: self.probed(
                r, p, f.exception() is None and f.value()))

    def check_probe(self, src, pid, name, token):
        """A peer's probe: True if this process can read what ``src`` wrote."""
        if self.maps is None or type(pid) is not int or type(name) is not str \
                or type(token) is not str:
            return False
        return self.maps.check_probe(src, pid, name, token)

    def probed(self, rank, probe, ok):
        """The answer of ``rank`` to ``probe``: from now on, lend to it if ``ok``."""
        self.pool.end_probe(probe[1])
        if ok is True:
            self.peers.add(rank)

    # -- messages --
    def settle(self, src, segments, mapped=()):
        """After decoding (or dropping) a message of ``src``: release what was not mapped."""
        if segments and src is not None and self.maps is not None:
            self.maps.settle(src, segments, mapped)

    def give_back(self, dst, names):
        """An outgoing message to ``dst`` was not sent: its segments are free again."""
        if names and self.pool is not None:
            self.pool.release(names, dst)

    def released(self, src, names):
        """A RELEASE from ``src``."""
        if self.pool is not None:
            self.pool.release(names, src)

    def on_release_notices(self, src, items):
        """``shm.release`` notices of ``src`` (lists of segment names it no longer maps)."""
        self.released(src, [name for names in items if type(names) is list
                            for name in names if type(name) is str])

    def peer_gone(self, rank):
        """``rank`` died or left: what it held comes back, what it lent is forgotten."""
        if self.pool is not None:
            self.pool.reclaim(rank)
            self.maps.forget(rank)
        self.peers.discard(rank)
        self._asked.discard(rank)

    def _queue_release(self, src, names):  # a finalizer, any thread
        if self._closed:  # a view that outlived its world: there is nobody to tell
            return
        self._releases.append((src, names))
        self._wake()

    def has_wanted(self):
        return bool(self._wanted)

    def has_releases(self):
        return bool(self._releases)

    def take_releases(self):
        """``{lender rank: [segment names]}`` released since the last call."""
        releases = self._releases
        by_src = {}
        while releases:
            src, names = releases.popleft()
            by_src.setdefault(src, []).extend(names)
        return by_src

    def send_releases(self, transport, rank):
        """Send the queued releases, one RELEASE per peer (on the socket owner's thread)."""
        if not self._releases:
            return
        for src, names in self.take_releases().items():
            if transport.down(src) is None:
                transport.send(src, [pack_header(Kind.RELEASE, 0, rank, None, names), b""])

    def lent(self):
        return self.pool.stats()["lent"] if self.pool is not None else 0

    def stats(self):
        return self.pool.stats() if self.pool is not None else None

    def close(self):
        self._closed = True
        self._releases.clear()
        if self.pool is not None:
            self.pool.close()
            self.maps.close()


class LendingContext:
    """The codec hooks (see ``codec.py``) of one message to or from ``self.peer``: an array
    of at least the pool's threshold to a peer proven to share memory is lent from the
    pool; a reference in a received message is mapped, if its header declared it.

    Subclasses keep ``peer``, ``segments`` (lent for an outgoing message, declared by an
    incoming one's header) and ``mapped``, and say where their :class:`SameHost` is:
    ``_same_host()``.
    """

    __slots__ = ()

    def external_array(self, a):
        sh = self._same_host()
        pool = sh.pool
        if pool is None or a.nbytes < pool.threshold:
            return None
        if self.peer not in sh.peers:
            sh.want(self.peer)
            return None
        name = pool.lend(a, self.peer)
        if name is None:
            return None
        self.segments.append(name)
        return [name, a.nbytes]

    def external_buffer(self, ref):
        maps = self._same_host().maps
        if maps is None or len(ref) != 2 or ref[0] not in self.segments:
            raise codec.CodecError(f"shared-memory reference {ref!r} is not declared in the "
                                   "message header")
        try:
            view = maps.view(ref[0], ref[1], self.peer)
        except (OSError, ValueError) as e:
            raise codec.CodecError(f"shared-memory segment {ref[0]!r}: {e}") from None
        self.mapped.add(ref[0])
        return view

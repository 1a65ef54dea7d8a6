"""Saved-tensor hooks that move activations out of the process and bring them back.

:class:`OffloadHooks` is a ``saved_tensors_hooks`` over a *tier* (disk, a remote
store, memory with a budget); ``save_on_disk``, ``save_on_remote`` and
``save_tiered`` build it. What it guarantees, whatever the tier:

* gradients are bit for bit those without offloading: the bytes come back
  unchanged (checksummed on disk), aligned as at the source, with each saved
  tensor's own dtype, shape, strides and offset;
* the same memory saved twice (``x`` and ``x.t()``, a slice of ``x``) is stored once
  (see :mod:`distgrad.offload.views`);
* an in-place change after saving still raises autograd's version-counter error;
* ``unpack`` may run many times (``retain_graph=True``) and returns the same data;
  a record is freed when the last saved tensor using it is released (after
  backward, or when the graph is dropped after an error);
* parameters, buffers and other leaves are never offloaded;
* backward rarely waits: a prefetcher reads ahead in the order backward needs the
  tensors (the reverse of the order they were saved), within ``prefetch_bytes``.
"""
import itertools
import threading
import time
import weakref
from collections import Counter, deque

from ..autograd.graph import saved_tensors_hooks
from ..utils.lifetimes import join_all
from .policy import OffloadPolicy
from .stats import OffloadStats
from .tiered import check_tier
from .tracking import module_stack
from .views import DedupTable, span_of
from ..autograd._internal import array_of, describe, version_counter, view_base, wrap

__all__ = ["OffloadHooks", "DEFAULT_MIN_BYTES", "DEFAULT_PREFETCH_BYTES",
           "DEFAULT_INFLIGHT_BYTES"]

#: Saved tensors smaller than this stay in memory unless a policy says otherwise.
DEFAULT_MIN_BYTES = 64 << 10
#: How many bytes the prefetcher may hold read ahead of backward.
DEFAULT_PREFETCH_BYTES = 8 << 20
#: How many bytes may be on their way to a tier before the forward pass waits.
DEFAULT_INFLIGHT_BYTES = 16 << 20
#: A record read ahead but not used by the time backward is this many saved tensors
#: further is dropped from the read-ahead window (its node did not run, or ran
#: out of order); if it is needed after all, it is read again.
_SKIP_SLACK = 16


class _Record:
    """One stored span of memory, shared by the saved tensors that view it."""

    __slots__ = ("key", "nbytes", "align", "lo", "hi", "vc", "version", "root_key", "refs",
                 "cache", "__weakref__")

    def __init__(self, key, span, vc, version):
        self.key, self.nbytes = key, span.nbytes
        self.lo, self.hi, self.align = span.lo, span.hi, span.lo % 64
        self.vc, self.version = vc, version
        self.root_key = None
        self.refs = 1
        self.cache = None   # weakref to the bytes while something holds them


class _Saved:
    """What ``pack`` returns for an offloaded tensor; its death frees the record."""

    __slots__ = ("owner", "record", "meta", "vc", "version", "seq", "pass_gen", "plan_index",
                 "__weakref__")

    def __del__(self):
        owner = self.owner
        if owner is not None:
            try:
                owner._release(self.record)
            except Exception:  # noqa: BLE001 - interpreter shutdown; the run dir goes anyway
                pass


class _Kept:
    """What ``pack`` returns for a tensor left in memory (an alias, not a copy)."""

    __slots__ = ("tensor", "version")

    def __init__(self, tensor, version):
        self.tensor, self.version = tensor, version


def _check_version(vc, version, array):
    """Autograd's in-place error (``array`` needs only ``dtype`` and ``shape``)."""
    if vc[0] != version:
        raise RuntimeError(
            "one of the variables needed for gradient computation has been modified by an "
            f"inplace operation: [{describe(array)}] is at version {vc[0]}; expected version "
            f"{version} instead. Hint: the saved tensor was modified in place after it was "
            "saved for backward; use an out-of-place op or .clone() before modifying it.")


def _owned_elsewhere(tensor):
    """Parameters, buffers, inputs and views of them: someone else keeps their memory."""
    if tensor.grad_fn is None:
        return True
    base = view_base(tensor)
    return base is not None and base.grad_fn is None


class OffloadHooks(saved_tensors_hooks):
    """Offload saved tensors to ``tier`` under ``policy`` (a context manager, nestable).

    ``min_bytes`` (or ``policy.min_bytes``): smaller saved tensors stay in memory.
    ``model``: the module whose qualified names the policy's module rules match.
    ``prefetch_bytes``: read-ahead window of backward. ``owns_tier``: close the tier
    with this object.

    The object may be entered many times (every step, or around several blocks) and
    from several threads; ``stats`` counts what it did. ``on_backward_start()``
    starts reading ahead at once, before the first unpack would.

    >>> import distgrad
    >>> from distgrad.offload import save_on_disk
    >>> x = distgrad.randn(64, 64, requires_grad=True)
    >>> with save_on_disk(min_bytes=0) as hooks:
    ...     y = (x @ x).tanh().sum()
    >>> y.backward()
    >>> hooks.stats.tensors_offloaded > 0
    True
    >>> hooks.close()
    """

    def __init__(self, tier, *, policy=None, min_bytes=None, model=None,
                 prefetch_bytes=DEFAULT_PREFETCH_BYTES, owns_tier=True):
        super().__init__(self._pack, self._unpack)
        self.tier = check_tier(tier)
        try:
            policy = self._check(policy, min_bytes, model, prefetch_bytes)
        except Exception:
            if owns_tier:
                tier.close()
            raise
        self.policy = policy
        self.model = model
        self.stats = OffloadStats()
        self._cond = threading.Condition(threading.Lock())
        self._dedup = DedupTable()
        self._keys = itertools.count(1)
        self._seqs = itertools.count()
        self._order = []            # (seq, weakref to _Saved) in pack order
        self._order_pruned_at = 0
        self._deferred = deque()    # records whose last saved tensor died, to free
        self._drainer = None        # the thread freeing them once the lock is free
        self._drainer_lock = threading.RLock()  # reentrant: a collection may start inside
        self._tls = threading.local()
        self._closed = False
        self._prefetcher = _Prefetcher(self.tier, self.stats, self._cond, prefetch_bytes)
        self._finalizer = weakref.finalize(self, _shutdown, self._prefetcher,
                                           self.tier if owns_tier else None)

    @staticmethod
    def _check(policy, min_bytes, model, prefetch_bytes):
        if policy is None:
            policy = OffloadPolicy(min_bytes=DEFAULT_MIN_BYTES if min_bytes is None else min_bytes)
        elif not isinstance(policy, OffloadPolicy):
            raise TypeError(f"policy must be an OffloadPolicy, not {type(policy).__name__}")
        elif min_bytes is not None:
            raise ValueError("give min_bytes either as an argument or in the policy, not both")
        if prefetch_bytes < 0:
            raise ValueError(f"prefetch_bytes must be >= 0, got {prefetch_bytes}")
        if policy.every_nth_layer > 1 and not policy.layers and model is None:
            raise ValueError("every_nth_layer without 'layers' counts the model's children: "
                             "pass model=")
        return policy

    def observe_io(self, fn):
        """Call ``fn(kind, nbytes, start_ns, end_ns)`` for each write to the tier and each
        read from it that cost I/O (see :class:`~distgrad.offload.tier.Tier`); a tier of
        one's own without ``observe`` reports nothing."""
        observe = getattr(self.tier, "observe", None)
        if observe is not None:
            observe(fn)

    # ------------------------------------------------------------ context
    def __enter__(self):
        if self._closed:
            raise RuntimeError("this offloading hook object is closed")
        tls = self._tls
        depth = getattr(tls, "depth", 0)
        super().__enter__()
        if depth == 0 and self.policy.tracks_modules:
            self._start_tracking(tls)
        tls.depth = depth + 1
        return self

    def __exit__(self, *exc):
        tls = self._tls
        tls.depth -= 1
        if tls.depth == 0 and getattr(tls, "listener", None) is not None:
            module_stack.remove_listener(tls.listener)
            module_stack.release()
            tls.listener = None
        return super().__exit__(*exc)

    def _start_tracking(self, tls):
        model = self.model
        names = {id(m): n for n, m in model.named_modules()} if model is not None else {}
        children = {id(m) for m in model.children()} if model is not None else set()
        tls.names, tls.layer_count, tls.layers = names, 0, []
        policy = self.policy

        def listener(module, entering):
            if policy.is_layer(module, names.get(id(module)), id(module) in children):
                if entering:
                    tls.layers.append(tls.layer_count)
                    tls.layer_count += 1
                elif tls.layers:
                    tls.layers.pop()
        tls.listener = listener
        module_stack.acquire()
        module_stack.add_listener(listener)

    # ------------------------------------------------------------ pack
    def _wants(self, tensor, nbytes):
        policy = self.policy
        if not policy.tracks_modules:
            return policy.wants(tensor, nbytes)
        tls = self._tls
        names = getattr(tls, "names", {})
        modules = [(m, names.get(id(m))) for m in module_stack.current()]
        layers = getattr(tls, "layers", None)
        return policy.wants(tensor, nbytes, modules, layers[-1] if layers else None)

    def _pack(self, tensor):
        data = array_of(tensor)
        vc = version_counter(tensor)
        version = vc[0]
        if self._closed:
            raise RuntimeError("this offloading hook object is closed")
        if _owned_elsewhere(tensor) or not self._wants(tensor, data.nbytes):
            self.stats.add(tensors_kept=1)
            return _Kept(tensor.detach(), version)
        span, meta = span_of(data)
        with self._cond:
            record = self._dedup.find(span, vc, version)
            if record is not None:
                record.refs += 1
        if record is not None:
            meta.offset += span.lo - record.lo
            self.stats.add(tensors_deduplicated=1, bytes_deduplicated=span.nbytes)
        else:
            record = _Record(next(self._keys), span, vc, version)
            waited = self.tier.put(record.key, span.payload)
            with self._cond:
                self._dedup.add(span, record)
            self.stats.add(tensors_offloaded=1, bytes_offloaded=span.nbytes,
                           forward_wait_s=waited)
        handle = _Saved()
        handle.owner, handle.vc, handle.version = self, vc, version
        handle.pass_gen = handle.plan_index = -1
        handle.record, handle.meta = record, meta
        with self._cond:
            handle.seq = next(self._seqs)
            self._order.append((handle.seq, weakref.ref(handle)))
            if len(self._order) >= 2 * self._order_pruned_at + 64:
                self._order = [(s, r) for s, r in self._order if r() is not None]
                self._order_pruned_at = len(self._order)
        return handle

    # ------------------------------------------------------------ unpack
    def _unpack(self, packed):
        if type(packed) is _Kept:
            t = packed.tensor
            _check_version(version_counter(t), packed.version, array_of(t))
            return t
        _check_version(packed.vc, packed.version, packed.meta)
        if self._closed:
            raise RuntimeError(f"{self!r} was closed: the tensors it offloaded are gone")
        payload = self._prefetcher.take(packed, self._order)
        return wrap(packed.meta.rebuild(payload))

    # ------------------------------------------------------------ releasing
    def _release(self, record):
        """The saved tensor of ``record`` died (any thread, maybe inside GC). Free it now if
        the lock is free; otherwise a drainer thread frees it as soon as the holder lets go.
        Never wait here: a collection inside a locked section would wait for itself, and
        the holder may be the read-ahead thread, which can keep the lock for seconds."""
        self._deferred.append(record)
        self._drain()
        if self._deferred:
            self._start_drainer()

    def _drain(self, blocking=False):
        """Free the deferred records: if the lock is free now, or (``blocking``, only on
        the drainer thread) once it is. Their files go after the lock is let go."""
        while self._deferred and self._cond.acquire(blocking=blocking):
            freed = []
            try:
                while self._deferred:
                    record = self._deferred.popleft()
                    record.refs -= 1
                    if record.refs == 0:
                        self._dedup.discard(record)
                        self._prefetcher.forget(record)
                        freed.append(record.key)
            finally:
                self._cond.release()
            for key in freed:
                try:
                    self.tier.delete(key)
                except Exception:  # noqa: BLE001 - a dead store has freed it already
                    pass

    def _start_drainer(self):
        with self._drainer_lock:
            if self._drainer is None:
                self._drainer = threading.Thread(target=self._drain_when_free, daemon=True,
                                                 name="distgrad-offload-release")
                self._drainer.start()

    def _drain_when_free(self):
        while True:
            self._drain(blocking=True)  # the holder lets go at its next wait, or when done
            with self._drainer_lock:
                if not self._deferred:
                    self._drainer = None
                    return

    # ------------------------------------------------------------ public
    def on_backward_start(self):
        """Start reading ahead now, from the tensor saved last (backward's first need).

        The coordinator of a distributed pass calls this on a worker just before
        that worker's part of backward starts; locally the first unpack does it.
        """
        with self._cond:
            last = None
            for _, ref in reversed(self._order):
                last = ref()
                if last is not None:
                    break
            if last is not None:
                self._prefetcher.start_pass(last, self._order)
        self._drain()

    def flush(self, timeout=60.0):
        """Wait until every put has been stored (for measurements and tests)."""
        self.tier.flush(timeout)
        self._drain()

    def live_records(self):
        """How many stored records are still referenced by saved tensors."""
        self._drain()
        with self._cond:
            return len({id(r().record) for _, r in self._order if r() is not None})

    def close(self):
        """Stop reading ahead, let the release thread finish freeing what died, and close
        the tier (if this object owns it)."""
        self._closed = True
        with self._drainer_lock:
            drainer = self._drainer
        if drainer is not None:  # it ends once the lock is free and nothing is deferred
            join_all([drainer], 10.0, "offload release")
        self._finalizer()

    def __repr__(self):
        return f"{type(self).__name__}({self.tier.describe()}, {self.policy!r})"


def _shutdown(prefetcher, tier):
    prefetcher.stop()
    if tier is not None:
        tier.close()


class _Prefetcher:
    """Reads records ahead of backward, in the order backward will unpack them.

    A *pass* starts at the first unpack (or ``on_backward_start``) and plans the
    live saved tensors from the one asked for back to the first one saved. A
    background thread loads their records into a window of ``window_bytes``; an
    unpack takes its record from the window (a hit) or reads it itself (a miss).
    A record stays in the window until every saved tensor of the pass that uses it
    has been unpacked, so ``x`` saved by two ops is read once. An unpack of a saved
    tensor already unpacked in this pass (``retain_graph``: the next backward)
    starts a new pass. All state is guarded by the hook object's condition.
    """

    IDLE_EXIT = 5.0

    def __init__(self, tier, stats, cond, window_bytes):
        self.tier, self.stats, self._cond = tier, stats, cond
        self.window_bytes = window_bytes
        self._gen = 0
        self._plan = []         # weakrefs to _Saved, in the order backward needs them
        self._cursor = 0
        self._remaining = Counter()  # record -> unpacks still expected in this pass
        self._last_use = {}     # record -> plan index of its last expected unpack
        self._loaded = {}       # record -> payload (or the exception its read raised)
        self._loading = None
        self._window = 0
        self._high = -1         # highest plan index unpacked in this pass
        self._thread = None
        self._stopped = False

    # called with the condition held -------------------------------------------
    def start_pass(self, first, order):
        self._gen += 1
        plan = [r for s, r in reversed(order) if s <= first.seq]
        self._plan, self._cursor, self._high = plan, 0, -1
        self._remaining.clear()
        self._last_use.clear()
        self._loaded.clear()
        self._window = 0
        for i, ref in enumerate(plan):
            h = ref()
            if h is not None:
                h.plan_index = i
                self._remaining[h.record] += 1
                self._last_use[h.record] = i
        if self.window_bytes > 0 and (self._thread is None or not self._thread.is_alive()):
            self._thread = threading.Thread(target=self._run, name="distgrad-offload-prefetch",
                                            daemon=True)
            self._thread.start()
        self._cond.notify_all()

    def forget(self, record):
        payload = self._loaded.pop(record, None)
        if payload is not None and not isinstance(payload, BaseException):
            self._window -= record.nbytes
            self._cond.notify_all()
        self._remaining.pop(record, None)

    def _consume(self, record):
        """One expected unpack of ``record`` happened: free its window slot after the last."""
        self._remaining[record] -= 1
        if self._remaining[record] <= 0:
            self._remaining.pop(record, None)
            self.forget(record)

    def _drop_skipped(self):
        for rec in [r for r in self._loaded if self._last_use.get(r, -1) < self._high - _SKIP_SLACK]:
            self.forget(rec)

    # ------------------------------------------------------------ the unpacking thread
    def take(self, handle, order):
        """The payload of ``handle``'s record, from the window or read now."""
        record = handle.record
        t0 = time.perf_counter()
        payload = None
        with self._cond:
            if handle.pass_gen == self._gen or handle.plan_index < 0 or not self._plan:
                self.start_pass(handle, order)
            gen = self._gen
            while self._loading is record and self._gen == gen:
                self._cond.wait(1.0)
            payload = self._loaded.get(record)
            handle.pass_gen = gen
            self._high = max(self._high, handle.plan_index)
            if payload is not None:
                self._consume(record)
            else:
                self._remaining[record] -= 1
            self._drop_skipped()
            if isinstance(payload, BaseException):
                raise payload
        hit = payload is not None
        if payload is None:
            cached = record.cache() if record.cache is not None else None
            if cached is not None:
                payload, hit = cached, True
            else:
                hit = self.tier.holds(record.key)
                payload = self.tier.get(record.key, record.align)
                record.cache = weakref.ref(payload)
                self.stats.add(bytes_read=record.nbytes)
        self.stats.add(prefetch_hits=int(hit), prefetch_misses=int(not hit),
                       backward_wait_s=time.perf_counter() - t0)
        return payload

    # ------------------------------------------------------------ the read-ahead thread
    def _next_record(self):
        while self._cursor < len(self._plan):
            h = self._plan[self._cursor]()
            self._cursor += 1
            if h is None or h.pass_gen == self._gen:
                continue
            rec = h.record
            if rec in self._loaded or self._remaining.get(rec, 0) <= 0:
                continue
            return rec
        return None

    def _run(self):
        cond = self._cond
        while True:
            with cond:
                idle_since = time.monotonic()
                while True:
                    if self._stopped:
                        return
                    rec = self._next_record()
                    if rec is not None:
                        break
                    if time.monotonic() - idle_since > self.IDLE_EXIT:
                        self._thread = None
                        return
                    cond.wait(0.5)
                gen = self._gen
                while self._window and self._window + rec.nbytes > self.window_bytes \
                        and self._gen == gen and not self._stopped:
                    cond.wait(0.5)
                if self._gen != gen or self._stopped or rec.refs <= 0:
                    continue
                self._loading = rec
            payload = rec.cache() if rec.cache is not None else None
            try:
                if payload is None:
                    payload = self.tier.get(rec.key, rec.align)
                    rec.cache = weakref.ref(payload)
                    self.stats.add(bytes_read=rec.nbytes)
            except Exception as e:  # noqa: BLE001 - handed to the unpack that needs it
                payload = e
            with cond:
                self._loading = None
                if self._gen == gen and rec.refs > 0 and self._remaining.get(rec, 0) > 0:
                    self._loaded[rec] = payload
                    if not isinstance(payload, BaseException):
                        self._window += rec.nbytes
                cond.notify_all()
            del payload

    def stop(self):
        """Stop reading ahead and join the read-ahead thread (it ends at its next look at
        the condition, or after the read it is in)."""
        with self._cond:
            self._stopped = True
            self._loaded.clear()
            self._plan = []
            self._cond.notify_all()
            thread = self._thread
        if thread is not None:
            join_all([thread], 10.0, "offload read-ahead")

"""``DistributedOptimizer``: one local optimizer per parameter owner, stepped per context.

``step(context_id)`` applies, on every owner at once, the gradients that context
accumulated there (never ``.grad``), so concurrent contexts each step with their own.
"""
import threading

from distgrad.autograd._internal import wrap
from distgrad.distributed.autograd import container as _c
from distgrad.rpc import api as _rpc
from distgrad.rpc import entry_point

__all__ = ["DistributedOptimizer", "local_optimizer", "step_local"]


class _LocalOptimizer:
    """Lives on a parameter owner; applies a context's gradients with a local optimizer."""

    _lock = threading.Lock()  # as PyTorch: one step at a time per process (.grad is shared)

    def __init__(self, optimizer_cls, param_rrefs, args, kwargs):
        self.params = [r.local_value() for r in param_rrefs]
        self.optim = optimizer_cls(self.params, *args, **kwargs)

    def step(self, context_id):
        ctx = _c.get_context(context_id)
        grads = {}
        if ctx is not None:
            with ctx.lock:
                grads = dict(ctx.grads)
        with self._lock:
            saved = [p.grad for p in self.params]
            try:
                for p in self.params:
                    g = grads.get(p)
                    p.grad = wrap(_c.read_only(g)) if g is not None else None
                self.optim.step()
            finally:
                for p, g in zip(self.params, saved):
                    p.grad = g


_optimizers = {}  # on each owner: key -> _LocalOptimizer (calls name keys, not RRefs)


def local_optimizer(optimizer_id):
    """On a parameter owner: the local optimizer (a ``distgrad.optim.Optimizer`` over the
    parameters this process owns) that ``DistributedOptimizer`` ``optimizer_id`` steps here;
    for checkpoints (``state_dict``/``load_state_dict``). A distgrad extension: PyTorch's
    DistributedOptimizer keeps no reachable state."""
    return _local(optimizer_id).optim


def _local(optimizer_id):
    local = _optimizers.get(optimizer_id)
    if local is None:
        raise KeyError(f"this process holds no parameters of distributed optimizer "
                       f"{optimizer_id!r}")
    return local


def step_local(optimizer_id, context_id):
    """On a parameter owner: apply ``context_id``'s gradients here with the local optimizer
    of ``DistributedOptimizer`` ``optimizer_id``, as its ``step(context_id)`` does on every
    owner. A distgrad extension, for a program whose owners know when their own
    gradients are final (``distgrad launch``'s stages step as soon as their part of the
    backward is done, while the others still run theirs)."""
    local = _local(optimizer_id)
    _c.require_context(context_id)  # a released context has no gradients left to apply
    local.step(context_id)


@entry_point
def _new_local_optimizer(key, optimizer_cls, param_rrefs, args, kwargs):
    _optimizers[key] = _LocalOptimizer(optimizer_cls, param_rrefs, args, kwargs)
    return True


@entry_point
def _step(key, context_id):
    _optimizers[key].step(context_id)


@entry_point
def _drop(key):
    _optimizers.pop(key, None)


class DistributedOptimizer:
    """``DistributedOptimizer(optimizer_class, params_rref, *args, **kwargs)``.

    ``params_rref``: RRefs to parameters on any workers (e.g. ``RemoteModule.remote_parameters()``
    plus ``RRef(p)`` for local ones); ``optimizer_class`` travels by reference.
    """

    def __init__(self, optimizer_class, params_rref, *args, **kwargs):
        by_owner = {}
        for r in params_rref:
            by_owner.setdefault(r.owner_name(), []).append(r)
        #: names this optimizer on the owners (``local_optimizer(id)``)
        self.id = self._key = key = _c.new_id()
        me = _c.my_name()
        self._owners = [o for o in by_owner if o != me]
        self._local = None
        if me in by_owner:
            self._local = _optimizers[key] = _LocalOptimizer(optimizer_class, by_owner[me],
                                                             args, kwargs)
        with _c.scope(None):
            futs = [_rpc.rpc_async(o, _new_local_optimizer,
                                   (key, optimizer_class, by_owner[o], args, kwargs))
                    for o in self._owners]
            for f in futs:  # surface a bad optimizer argument here
                f.wait()

    def __del__(self):
        _optimizers.pop(getattr(self, "_key", None), None)
        try:
            for o in self._owners:
                _rpc.rpc_async(o, _drop, (self._key,))
        except Exception:  # noqa: BLE001 - the world is gone: nothing left to free
            pass

    def step(self, context_id):
        """Apply ``context_id``'s gradients on every owner; raise the first failure."""
        _c.require_context(context_id)
        # The remote owners step asynchronously, overlapping the local step. Without a
        # local part the last owner gets a blocking call instead, whose reply comes
        # straight to this thread (an asynchronous reply costs a wake-up of the RPC
        # thread and then of this one, which only pays off when there is work to overlap).
        asynchronous = self._owners if self._local is not None else self._owners[:-1]
        blocking = self._owners[len(asynchronous):]
        with _c.scope(None):
            futs = [_rpc.rpc_async(o, _step, (self._key, context_id)) for o in asynchronous]
        first = None
        if self._local is not None:
            try:
                self._local.step(context_id)
            except Exception as e:  # noqa: BLE001 - wait for the others, then raise
                first = e
        for owner in blocking:
            try:
                with _c.scope(None):
                    _rpc.rpc_sync(owner, _step, (self._key, context_id))
            except Exception as e:  # noqa: BLE001 - wait for all, then raise
                first = first or e
        for f in futs:
            try:
                f.wait()
            except Exception as e:  # noqa: BLE001 - wait for all, then raise
                if first is None:
                    first = e
        if first is not None:
            raise first

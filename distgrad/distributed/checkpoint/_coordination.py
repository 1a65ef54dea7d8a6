"""The steps of a save or load across ranks (PyTorch's ``_DistWrapper``): each rank runs
its part, rank 0 (the coordinator) combines, and every rank learns the outcome. When a
step fails on any rank, every rank raises the same :class:`CheckpointException`
naming the ranks and their errors, instead of some ranks waiting for the others.

Values cross ranks through the object collectives (:mod:`distgrad.codec`, no
pickle), so the callers hand over plain data; errors travel as their type name,
message and traceback text. Without a process group (``no_dist``) the same steps
run in this process alone.
"""
import builtins
import traceback
import warnings

from ..collectives import barrier
from ..object_collectives import broadcast_object_list, gather_object, scatter_object_list
from ..process_group import get_rank, get_world_size, is_initialized
from .api import CheckpointException

__all__ = ["Coordination", "alone"]

_NO_DIST = ("torch.distributed is disabled, unavailable or uninitialized, assuming the intent "
            "is to {} in a single process.")


def alone(no_dist, doing, stacklevel):
    """Whether a ``save`` or ``load`` (``doing``) runs in this process alone: asked to
    (``no_dist``), or with no process group; then it warns, as PyTorch does, at the
    caller ``stacklevel`` frames above this function's caller."""
    no_dist = no_dist or not is_initialized()
    if no_dist:
        warnings.warn(_NO_DIST.format(doing), stacklevel=stacklevel + 1)
    return no_dist


class _RemoteFailure(RuntimeError):
    """An error of another rank whose class is not a built-in one."""


def _wrap(exc):
    return ["failed", type(exc).__name__, str(exc),
            "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))]


def _failed(value):
    return isinstance(value, list) and len(value) == 4 and value[0] == "failed"


def _rebuild(value):
    _, name, message, tb = value
    cls = getattr(builtins, name, None)
    if not (isinstance(cls, type) and issubclass(cls, Exception)):
        cls, message = _RemoteFailure, f"{name}: {message}"
    try:
        exc = cls(message)
    except Exception:  # noqa: BLE001 - a built-in class with another signature
        exc = _RemoteFailure(f"{name}: {message}")
    exc.remote_traceback = tb
    return exc


class Coordination:
    def __init__(self, group, use_dist, coordinator_rank=0):
        # coordinator_rank counts within ``group`` (rank 0 of a subgroup coordinates it)
        self.group, self.use_dist = group, use_dist
        self.coordinator_rank = coordinator_rank
        if use_dist:
            self.rank, self.world_size = get_rank(group), get_world_size(group)
        else:
            self.rank, self.world_size = 0, 1
        self.is_coordinator = self.rank == coordinator_rank

    # -- the collectives (one process: trivial) --
    def gather(self, value):
        if not self.use_dist:
            return [value]
        out = [None] * self.world_size if self.is_coordinator else None
        gather_object(value, out, group=self.group, group_dst=self.coordinator_rank)
        return out

    def scatter(self, values):
        if not self.use_dist:
            return values[0]
        out = [None]
        scatter_object_list(out, values if self.is_coordinator else None, group=self.group,
                            group_src=self.coordinator_rank)
        return out[0]

    def broadcast(self, value):
        if not self.use_dist:
            return value
        box = [value]
        broadcast_object_list(box, group=self.group, group_src=self.coordinator_rank)
        return box[0]

    def barrier(self):
        if self.use_dist:
            barrier(group=self.group)

    # -- the steps --
    def _local(self, fn, to_data):
        try:
            return to_data(fn())
        except (Exception, CheckpointException) as e:  # every rank must hear of it
            self._own_failure = e
            return _wrap(e)

    def _raise(self, step, values):
        failures, tracebacks = {}, {}
        for rank, v in enumerate(values):
            if _failed(v):
                own = rank == self.rank and getattr(self, "_own_failure", None)
                failures[rank], tracebacks[rank] = own or _rebuild(v), v[3]
        raise CheckpointException(step, failures, tracebacks)

    def reduce_scatter(self, step, map_fn, reduce_fn, to_data, from_data):
        """Each rank's ``map_fn()``; the coordinator's ``reduce_fn(list)`` returns one value
        per rank, and each rank gets its own back."""
        self._own_failure = None
        everything = self.gather(self._local(map_fn, to_data))
        messages = None
        if self.is_coordinator:
            if any(_failed(v) for v in everything):
                messages = [["failures", everything]] * self.world_size
            else:
                reduced = self._local(lambda: reduce_fn([from_data(v) for v in everything]),
                                      lambda rs: [to_data(r) for r in rs])
                messages = [["failures", [None] * self.coordinator_rank + [reduced]]] \
                    * self.world_size if _failed(reduced) else [["ok", r] for r in reduced]
        outcome = self.scatter(messages)
        if outcome[0] == "failures":
            self._raise(step, outcome[1])
        return from_data(outcome[1])

    def all_reduce(self, step, map_fn, reduce_fn, to_data, from_data, result_to_data=None,
                   result_from_data=None):
        """Each rank's ``map_fn()``; the coordinator's ``reduce_fn(list)`` is every rank's
        result."""
        self._own_failure = None
        everything = self.gather(self._local(map_fn, to_data))
        outcome = None
        if self.is_coordinator:
            if any(_failed(v) for v in everything):
                outcome = ["failures", everything]
            else:
                reduced = self._local(lambda: reduce_fn([from_data(v) for v in everything]),
                                      result_to_data or (lambda r: r))
                outcome = ["failures", [None] * self.coordinator_rank + [reduced]] \
                    if _failed(reduced) else ["ok", reduced]
        outcome = self.broadcast(outcome)
        if outcome[0] == "failures":
            self._raise(step, outcome[1])
        return (result_from_data or (lambda r: r))(outcome[1])

    def all_gather(self, step, map_fn):
        """Each rank's ``map_fn()`` (its result is not needed elsewhere): every rank learns
        whether all of them succeeded."""
        self._own_failure = None
        value = self._local(map_fn, lambda r: None)
        everything = self.gather(value)
        outcome = None
        if self.is_coordinator:
            outcome = ["failures", everything] if any(_failed(v) for v in everything) \
                else ["ok", None]
        outcome = self.broadcast(outcome)
        if outcome[0] == "failures":
            self._raise(step, outcome[1])

"""What every collective function does before and after its algorithm: check its
arguments PyTorch's way (its exception classes, messages that name the argument),
build the fingerprint that must agree on every rank (op, shapes, dtypes, root,
reduction), and run the program in the group (:func:`_run`), here and now when
the group has one rank, otherwise through the world's communicator.

The names keep their underscore: they are this package's internals, shared by
``collectives.py``, ``point_to_point.py`` and ``object_collectives.py``.
"""
import numpy as np

from distgrad.autograd._internal import array_of, bump_version
from distgrad._tensor import Tensor

from .work import Work
from .process_group import (GroupMember, _warn_not_in_group, _world, get_group_rank,
                            resolve_group)


def _tensor(t, param):
    if not isinstance(t, Tensor):
        raise TypeError(f"Invalid function argument. Expected parameter `{param}` of type "
                        f"torch.Tensor\n             but got {type(t)} instead.")
    return t


def _tensors(ts, param):
    if not isinstance(ts, (list, tuple)) or not all(isinstance(t, Tensor) for t in ts):
        raise TypeError(f"Invalid function argument. Expected parameter `{param}` of type "
                        f"List[torch.Tensor]\n             but got {type(ts)} instead.")
    return list(ts)


def _dtype_name(t):
    return array_of(t).dtype.name


def _fp(name, tensors=(), **params):
    return [name, [list(array_of(t).shape) for t in tensors], [_dtype_name(t) for t in tensors],
            [[k, v] for k, v in params.items()]]


class _Out:
    """A tensor written by a collective: a flat contiguous array for the program (the
    tensor's own memory when it is contiguous), copied back at the end otherwise."""

    __slots__ = ("t", "flat", "copy_back")

    def __init__(self, t, collective):
        a = array_of(t)
        if not a.flags.writeable:
            raise RuntimeError(f"{collective}: the output tensor of shape {list(a.shape)} is "
                               "read-only (a tensor received from a peer?); clone() it first")
        self.t = t
        self.copy_back = not a.flags.c_contiguous
        self.flat = (np.ascontiguousarray(a) if self.copy_back else a).reshape(-1)

    def done(self):
        if self.copy_back:
            np.copyto(array_of(self.t), self.flat.reshape(array_of(self.t).shape))
        bump_version(self.t)


def _flat(t):
    return np.ascontiguousarray(array_of(t)).reshape(-1)


def _same_list(ts, ref, n, collective, what, exc=RuntimeError):
    """``ts`` has ``n`` tensors shaped and typed like ``ref``."""
    if len(ts) != n:
        raise exc(f"{collective}: invalid {what} (expected {n} tensors, got {len(ts)})")
    for i, t in enumerate(ts):
        _same(t, ref, collective, what, i)


def _same(t, ref, collective, what, i):
    if array_of(t).shape != array_of(ref).shape:
        raise RuntimeError(f"{collective}: invalid tensor size at index {i} of {what} "
                           f"(expected {tuple(array_of(ref).shape)}, got {tuple(array_of(t).shape)})")
    if array_of(t).dtype != array_of(ref).dtype:
        raise RuntimeError(f"{collective}: invalid tensor type at index {i} of {what} "
                           f"(expected {_dtype_name(ref)}, got {_dtype_name(t)})")


def _group(group, collective):
    """The group to run in, or None (with PyTorch's warning) when this rank is not in it."""
    g = resolve_group(group)
    if g is GroupMember.NON_GROUP_MEMBER:
        _warn_not_in_group(collective)
        return None
    return g


def _root(g, global_rank, group_rank, param, collective, checked=True):
    """The group rank of a root given as a global rank or (``group_*``) a group rank; with
    ``checked=False`` its range is left to :func:`_check_root` (gather and scatter check
    their lists first, as PyTorch does)."""
    if group_rank is not None:
        if global_rank is not None:
            raise ValueError(f"Can't specify both {param} and group_{param}")
        r = group_rank
    elif global_rank is None:
        raise ValueError(f"{collective}: {param} (a global rank) or group_{param} must be given")
    elif g is _world.default_pg:
        r = global_rank
    else:
        r = get_group_rank(g, global_rank)
    return _check_root(g, r, collective) if checked else r


def _check_root(g, r, collective):
    if isinstance(r, bool) or not isinstance(r, int) or not 0 <= r < g.size():
        raise RuntimeError(f"{collective}: invalid root rank: {r} (the group has ranks "
                           f"0..{g.size() - 1})")
    return r


class _Alone:
    """The context of a program in a one-rank group: it never sends nor waits."""
    rank, size = 0, 1

    def send(self, peer, step, payload):
        raise RuntimeError("a one-rank collective has nobody to send to")

    def recv(self, peer, step):
        raise RuntimeError("a one-rank collective has nobody to receive from")


def _run(g, fp, planned, result=None, on_done=None, async_op=False):
    """Run collective ``fp`` (``planned``: (program, natural) from ``algorithms``) in ``g``."""
    program, natural = planned
    work = Work(result)
    if g._state is None:  # this rank alone: run the program here and now
        for _ in program(_Alone()):
            raise RuntimeError(f"{fp[0]}: a one-rank program waited for a message")
        if on_done is not None:
            on_done()
        work._finish()
    else:
        _world.comm.submit(g._state, fp, program, work, needs_left=not natural,
                           on_done=on_done)
    if async_op:
        return work
    work.wait()
    return None


def _done(*outs):
    def finish():
        for o in outs:
            o.done()
    return finish

"""Selective activation checkpointing: a policy chooses, op by op, which outputs of a
checkpointed region are kept from the forward instead of recomputed.

``create_selective_checkpoint_contexts(policy)`` gives the two contexts of
``checkpoint(..., context_fn=...)``: in the forward, an op observer (see
``distgrad/autograd/op_observers.py``) asks the policy about every op the region records
and keeps the outputs it says to save, by op and call index; in the recomputation, a
second observer hands each kept output back in place of the recomputed one, and ops
that can (linear layers, matrix products) skip computing it. So a region that keeps
its matrix products recomputes only the cheap ops between them.

Ops are named as in ``torch.ops.aten`` (``distgrad.ops.aten``, one name per op node:
``aten.linear.default`` is ``nn.Linear``, see ``distgrad/ops/overloads.py``). The policy
is called as ``policy(ctx, op, *inputs)`` with the op's tensor inputs (None where an
optional one is absent), ``ctx.op_output`` its output.
"""
import enum
import warnings
from collections import defaultdict

from ...autograd._internal import OpObserver, array_of, version_counter
from ...ops.overloads import OpOverload, OpOverloadPacket, aten, is_recorded, op_of, prim

__all__ = ["CheckpointPolicy", "SelectiveCheckpointContext", "SAC_IGNORED_OPS",
           "create_selective_checkpoint_contexts"]


class SelectiveCheckpointContext:
    """What a policy learns besides the op: ``op_output``, the op's output tensor(s).

    The policy runs in the forward only (the recomputation reuses its answers by call
    index), so ``is_recompute`` is always False."""

    def __init__(self, *, is_recompute, op_output=None):
        self.is_recompute = is_recompute
        self.op_output = op_output


class CheckpointPolicy(enum.Enum):
    """A policy's answer for one op call.

    ``MUST_SAVE`` / ``PREFER_SAVE``: keep the output from the forward.
    ``MUST_RECOMPUTE`` / ``PREFER_RECOMPUTE``: recompute it in backward.
    ``MUST_CPU_OFFLOAD`` / ``PREFER_CPU_OFFLOAD``: recomputed, as PyTorch's eager mode does
    (distgrad's tensors are in host memory already; ``distgrad.offload`` moves them
    further). A policy that recomputes every op is plain checkpointing; one that saves
    every op saves more than no checkpointing would (outputs nobody's backward needs).
    """
    MUST_SAVE = 0
    PREFER_SAVE = 1
    MUST_RECOMPUTE = 2
    PREFER_RECOMPUTE = 3
    MUST_CPU_OFFLOAD = 4
    PREFER_CPU_OFFLOAD = 5


_SAVE = (CheckpointPolicy.MUST_SAVE, CheckpointPolicy.PREFER_SAVE)

#: ops never asked about nor cached: checkpointing's own detaches and metadata queries
SAC_IGNORED_OPS = {aten.detach.default, prim.device.default}

_RECOMPUTE = object()   # storage entry: the policy said recompute
_CONSUMED = object()    # storage entry: handed back once already

_MISMATCH = ("This can happen if the operations in the checkpointed region are "
             "nondeterministic or depend on global state that changed between forward and "
             "backward.")


class _Kept:
    """A saved output: its array(s) and the version(s) it had, to catch later writes."""

    __slots__ = ("arrays", "counters", "versions", "multi")

    def __init__(self, result):
        self.multi = isinstance(result, list)
        tensors = result if self.multi else [result]
        self.arrays = [array_of(t) for t in tensors]
        self.counters = [version_counter(t) for t in tensors]
        self.versions = [vc[0] for vc in self.counters]

    def value(self, allow_mutation):
        if not allow_mutation and any(vc[0] != v for vc, v in zip(self.counters, self.versions)):
            raise RuntimeError("Tensor cached during selective activation checkpoint has been "
                               "mutated")
        return list(self.arrays) if self.multi else self.arrays[0]


class _Caching(OpObserver):
    """The forward's observer: asks the policy, keeps what it says to save."""

    def __init__(self, policy_fn, storage):
        self.policy_fn = policy_fn
        self.storage = storage
        self.calls = defaultdict(int)

    def after(self, node_cls, result, inputs, meta):
        op = op_of(node_cls)
        if op in SAC_IGNORED_OPS:
            return
        index = self.calls[op]
        self.calls[op] += 1
        output = [t.detach() for t in result] if isinstance(result, list) else result.detach()
        policy = self.policy_fn(SelectiveCheckpointContext(is_recompute=False, op_output=output),
                                op, *inputs)
        if isinstance(policy, bool):  # the older form: True saves
            policy = CheckpointPolicy.MUST_SAVE if policy else CheckpointPolicy.PREFER_RECOMPUTE
        if not isinstance(policy, CheckpointPolicy):
            raise TypeError(f"selective checkpoint policy returned {policy!r} for {op}; expected "
                            "a CheckpointPolicy or a bool")
        self.storage[op][index] = _Kept(result) if policy in _SAVE else _RECOMPUTE


class _Cached(OpObserver):
    """The recomputation's observer: hands back what the forward kept, once."""

    def __init__(self, storage, allow_cache_entry_mutation):
        self.storage = storage
        self.allow_mutation = allow_cache_entry_mutation
        self.calls = defaultdict(int)

    def __enter__(self):
        # Counting starts over with every recomputation, so a second one (retain_graph)
        # finds the consumed entries and says so.
        self.calls.clear()
        return super().__enter__()

    def _entry(self, op, index):
        entries = self.storage.get(op)
        if entries is None:
            raise RuntimeError(f"{op} encountered during backward but not found in storage. "
                               f"{_MISMATCH}")
        entry = entries.get(index)
        if entry is None:
            raise RuntimeError(f"{op} invocation index {index} encountered during backward but "
                               f"not found in storage. {_MISMATCH}")
        if entry is _CONSUMED:
            raise RuntimeError("Trying to backward an extra time. You are only allowed to "
                               "backward once on any region computed under selective "
                               "activation checkpoint.")
        return entry

    def lookup(self, node_cls):
        op = op_of(node_cls)
        entries = self.storage.get(op)
        entry = entries.get(self.calls[op]) if entries else None
        if isinstance(entry, _Kept) and not entry.multi:
            return entry.value(self.allow_mutation)
        return None

    def before(self, node_cls, out, inputs, meta):
        op = op_of(node_cls)
        if op in SAC_IGNORED_OPS:
            return out
        index = self.calls[op]
        self.calls[op] += 1
        entry = self._entry(op, index)
        if entry is _RECOMPUTE:
            return out
        self.storage[op][index] = _CONSUMED
        return entry.value(self.allow_mutation)


def _check_op_list(ops):
    for op in ops:
        if not isinstance(op, OpOverload):
            extra = (" Name an overload, not the whole op: for example aten.mm.default, not "
                     "aten.mm." if isinstance(op, OpOverloadPacket) else "")
            raise ValueError(f"Expected op in `op_list` to be an OpOverload but got: {op} of "
                             f"type {type(op)}.{extra}")
        if not is_recorded(op):
            warnings.warn(f"selective checkpointing: distgrad records no op {op}, so nothing "
                          "is saved for it (distgrad's ops are coarser than ATen's: "
                          "nn.Linear is aten.linear.default; see distgrad.ops.aten)",
                          stacklevel=3)


def create_selective_checkpoint_contexts(policy_fn_or_list, allow_cache_entry_mutation=False):
    """The ``context_fn`` result of selective checkpointing: ``(forward context,
    recomputation context)``.

    ``policy_fn_or_list``: ``policy(ctx, op, *inputs) -> CheckpointPolicy`` (or a bool,
    True to save), or a list of ops (``distgrad.ops.aten.<op>.<overload>``) to save, all
    others recomputed. ``allow_cache_entry_mutation``: do not check that a kept output
    was left unchanged until its recomputation.

    >>> import functools, distgrad
    >>> from distgrad.ops import aten
    >>> from distgrad.utils.checkpoint import checkpoint, create_selective_checkpoint_contexts
    >>> x = distgrad.randn(4, 4, requires_grad=True)
    >>> keep_mm = functools.partial(create_selective_checkpoint_contexts, [aten.mm.default])
    >>> y = checkpoint(lambda x: (x @ x).tanh(), x, use_reentrant=False, context_fn=keep_mm)
    >>> y.sum().backward()
    """
    if isinstance(policy_fn_or_list, list):
        ops = list(policy_fn_or_list)
        _check_op_list(ops)

        def policy_fn(ctx, op, *args, **kwargs):
            return CheckpointPolicy.MUST_SAVE if op in ops else CheckpointPolicy.PREFER_RECOMPUTE
    elif callable(policy_fn_or_list):
        policy_fn = policy_fn_or_list
    else:
        raise TypeError("policy_fn_or_list must be either a function or a list of ops.")
    storage = defaultdict(dict)
    return _Caching(policy_fn, storage), _Cached(storage, allow_cache_entry_mutation)

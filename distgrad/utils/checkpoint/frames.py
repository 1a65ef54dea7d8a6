"""``checkpoint(..., use_reentrant=False)``: checkpointing on saved-tensor hooks.

While the checkpointed function runs, a ``saved_tensors_hooks`` pair stands in for
every tensor an op saves for backward: the pack hook keeps an empty :class:`_Slot`
(and the tensor's shape, dtype and device, for the determinism check) instead of the
tensor. The first unpack of any slot of a checkpoint in a backward pass reruns the
function from its saved inputs under the forward's generator state, with hooks of its
own that put each tensor the rerun saves into the slot of the same rank; then every
unpack takes its slot's tensor. The graph backward walks is the original one: only
the saved tensors come from the rerun, so gradients are those of the run without
checkpointing, bit for bit.

The rules (those of PyTorch's nestable checkpoint):

* A tensor saved inside nested checkpoints belongs to the innermost one; a
  checkpoint's inputs are saved like any tensor, so an inner checkpoint's inputs belong
  to the outer one, and rerunning the inner one first reruns the outer one.
* A rerun starts as if no checkpoint were active, and one per checkpoint per backward
  pass (``autograd.grad``, ``.backward()``, a distributed pass; or per
  :class:`GraphExecGroup`); an unpack outside any backward reruns each time.
* A recomputed tensor lives until its unpack takes it (also with ``retain_graph``):
  a second unpack of one slot in one pass is an error.
* With early stop (the default), the rerun stops as soon as every slot is filled, by an
  exception the rerun's pack hook raises and the unpack catches.
* Saves in the rerun must match the forward's in number and, with the default
  determinism check, in shape, dtype and device; otherwise :class:`CheckpointError`.
"""
import contextlib
import itertools
import threading
import weakref

from ...autograd._internal import (Node, SavedTensor, TensorBase, current_graph_task,
                                   set_task_extension, task_extension)
from ...autograd.grad_mode import enable_grad, no_grad
from ...autograd.graph import saved_tensors_hooks

__all__ = ["CheckpointError", "Frame", "CheckpointHooks", "GraphExecGroup", "Override",
           "set_checkpoint_early_stop", "early_stop_setting", "DETERMINISM_CHECKS",
           "DEBUG_TIP"]

DEBUG_TIP = ("\nTip: pass debug=True to checkpoint(...) or wrap the code in "
             "`with distgrad.utils.checkpoint.set_checkpoint_debug_enabled(True):` to see "
             "the ops of the forward and of the recomputation side by side.")


class CheckpointError(RuntimeError):
    """What the forward saved and what its recomputation saved differ."""


def _shape_dtype_device(t):
    return {"shape": t.shape, "dtype": t.dtype, "device": t.device}


#: determinism_check value -> what of a saved tensor must match in the recomputation
DETERMINISM_CHECKS = {"default": _shape_dtype_device, "none": lambda t: None}

class Override:
    """A process-wide setting that a block may impose on every call made inside it (as
    PyTorch's are: global, not per thread); outside any block each call decides."""

    def __init__(self):
        self.value = None

    @contextlib.contextmanager
    def block(self, value):
        previous, self.value = self.value, value
        try:
            yield
        finally:
            self.value = previous

    def resolve(self, requested):
        return requested if self.value is None else self.value


_early_stop = Override()


def set_checkpoint_early_stop(enable):
    """Whether non-reentrant checkpoints made in this block stop their recomputation as
    soon as every tensor they need is recomputed (default: ``early_stop=`` of each call,
    True). Only the forward needs to be inside; its backward may run anywhere."""
    return _early_stop.block(enable)


def early_stop_setting(requested):
    return _early_stop.resolve(requested)


class _StopRecomputation(Exception):
    """Raised by the rerun's pack hook once every slot is filled (early stop)."""


class _Slot:
    """What the pack hook returns: the recomputed tensor goes here, by backward pass."""

    __slots__ = ("values", "__weakref__")

    def __init__(self):
        self.values = {}  # pass key -> tensor, None once unpacked


class _Pass:
    """One backward pass as checkpoints see it: a key for the slots, and which frames
    this pass has rerun (with their counts of saves)."""

    __slots__ = ("key", "reruns")
    _keys = itertools.count()

    def __init__(self):
        self.key = next(self._keys)
        self.reruns = weakref.WeakKeyDictionary()   # frame -> [saves counted]


class _GroupState(threading.local):
    current = None


_groups = _GroupState()


class GraphExecGroup:
    """Backward calls inside one ``with GraphExecGroup():`` rerun each checkpointed region
    at most once between them; they must not need the same saved tensor (each recomputed
    tensor is taken once). Only non-reentrant checkpoints are affected."""

    def __enter__(self):
        if _groups.current is not None:
            raise RuntimeError("GraphExecGroup contexts cannot be nested. Already inside "
                               f"group {_groups.current}")
        self._pass = _Pass()
        _groups.current = self
        return self

    def __exit__(self, *exc):
        _groups.current = None

    @classmethod
    def _get_current_group(cls):
        return _groups.current


def _current_pass():
    """The pass an unpack belongs to: the open group, else the running backward (kept on
    its graph task, so it goes with it), else a pass of its own."""
    group = _groups.current
    if group is not None:
        return group._pass
    task = current_graph_task()
    if task is None:
        return _Pass()
    state = task_extension(task, "checkpoint")
    if state is None:
        state = _Pass()
        set_task_extension(task, "checkpoint", state)
    return state


class Checkpoint(Node):
    """Names a checkpoint's inputs in autograd's error about a tensor modified in place
    after it was saved (they are saved for the checkpoint, not for an op)."""


_INPUTS_OWNER = Checkpoint()


class Frame:
    """One call of a non-reentrant checkpoint: its inputs, its slots and how to rerun."""

    def __init__(self, recompute, early_stop, metadata_fn, on_error=None):
        self.recompute = recompute     # recompute(*inputs): the function, as in forward
        self.early_stop = early_stop
        self.metadata_fn = metadata_fn
        self.on_error = on_error       # debug=True: turns a CheckpointError into a report
        self.inputs = []
        self.slots = []                # weakrefs to the forward's slots, in save order
        self.metadata = []             # metadata_fn of each saved tensor, in the same order
        self.forward_done = False
        self.lenient = False           # a backward inside the forward reran more: no check

    def save_inputs(self, args):
        # Saved as any tensor is: under the hooks of the enclosing checkpoint (or offload
        # hooks), with the version check that catches an in-place change before backward.
        self.inputs = [SavedTensor(a, False) if isinstance(a, TensorBase) else a for a in args]

    def _unpacked_inputs(self):
        return [a.unpack(_INPUTS_OWNER) if isinstance(a, SavedTensor) else a
                for a in self.inputs]

    # -- forward ----------------------------------------------------------------------
    def pack(self, tensor):
        slot = _Slot()
        self.slots.append(weakref.ref(slot))
        with no_grad():
            self.metadata.append(self.metadata_fn(tensor))
        return slot

    # -- backward ---------------------------------------------------------------------
    def unpack(self, slot):
        try:
            return self._unpack(slot)
        except CheckpointError as e:
            if self.on_error is None:
                raise
            self.on_error(e)
            raise

    def _unpack(self, slot):
        this_pass = _current_pass()
        key = this_pass.key
        if self not in this_pass.reruns:
            counted = [0]
            try:
                with _RerunHooks(self, key, counted), enable_grad():
                    self.recompute(*self._unpacked_inputs())
            except _StopRecomputation:
                pass
            this_pass.reruns[self] = counted
            self._check(key, counted[0])
        if key not in slot.values:
            raise CheckpointError("torch.utils.checkpoint: a saved tensor was not recomputed in "
                                  "this backward pass (internal error: please report it)")
        value = slot.values[key]
        if value is None:
            hint = ("Two backward calls in one GraphExecGroup must not need the same saved "
                    "tensor. " if _groups.current is not None else "")
            raise CheckpointError(
                "torch.utils.checkpoint: Unpack is being triggered for a tensor that was "
                f"already unpacked once. {hint}Read ctx.saved_tensors once per backward of a "
                "custom Function; a recomputed tensor is handed out once per backward pass.")
        slot.values[key] = None
        return value

    def _check(self, key, counted):
        if self.lenient:
            return
        if counted != len(self.slots):
            raise CheckpointError(
                "torch.utils.checkpoint: A different number of tensors was saved during the "
                "original forward and recomputation.\n"
                f"Number of tensors saved during forward: {len(self.slots)}\n"
                f"Number of tensors saved during recomputation: {counted}.{DEBUG_TIP}")
        differ = []
        for index, ref in enumerate(self.slots):
            slot = ref()
            if slot is None:  # its saved tensor was released (a backward inside forward)
                continue
            then, now = self.metadata[index], self.metadata_fn(slot.values[key])
            if then != now:
                differ.append(f"tensor at position {index}:\nsaved metadata: {then}\n"
                              f"recomputed metadata: {now}\n")
        if differ:
            raise CheckpointError(
                "torch.utils.checkpoint: Recomputed values for the following tensors have "
                "different metadata than during the forward pass.\n" + "".join(differ)
                + DEBUG_TIP)


class CheckpointHooks(saved_tensors_hooks):
    """The hooks of a checkpointed forward: slots instead of saved tensors."""

    def __init__(self, frame):
        super().__init__(frame.pack, frame.unpack)


class _RerunHooks(saved_tensors_hooks):
    """The hooks of a rerun: what it saves fills the forward's slots, in order."""

    def __init__(self, frame, key, counted):
        slots = frame.slots

        def pack(tensor):
            # Detached: a slot must not keep the rerun's graph alive. The rerun's own graph
            # keeps the tensor too, for a backward inside the checkpointed function.
            tensor = tensor.detach() if tensor.requires_grad else tensor
            index = counted[0]
            counted[0] += 1
            if index >= len(slots):
                if not frame.forward_done:
                    # A backward inside the function, without early stop: it reruns past
                    # what the forward had saved when it ran. Nothing to check against.
                    frame.lenient = True
                    return tensor
                raise CheckpointError("torch.utils.checkpoint: trying to save more tensors "
                                      "during recomputation than during the original forward "
                                      f"pass.{DEBUG_TIP}")
            slot = slots[index]()
            if slot is not None:  # else released already: nobody will unpack it
                slot.values[key] = tensor
            if frame.early_stop and counted[0] == len(slots):
                raise _StopRecomputation
            return tensor

        super().__init__(pack, lambda tensor: tensor)

"""``distgrad.utils.checkpoint``: activation checkpointing, as ``torch.utils.checkpoint``.

A checkpointed function keeps only its inputs from the forward; what its ops saved for
backward is recomputed, by running the function again, when backward needs it: memory
for compute. Gradients are those of the run without checkpointing, bit for bit.

>>> import distgrad
>>> from distgrad.utils.checkpoint import checkpoint
>>> layer = distgrad.nn.Sequential(distgrad.nn.Linear(8, 8), distgrad.nn.Tanh())
>>> x = distgrad.randn(4, 8, requires_grad=True)
>>> checkpoint(layer, x, use_reentrant=False).sum().backward()
>>> x.grad.shape
distgrad.Size([4, 8])

Two implementations, chosen by ``use_reentrant`` (pass it: without it, a warning, and
True, PyTorch's default): ``False`` (recommended) works on saved-tensor hooks
(:mod:`.frames`): any backward (``autograd.grad``, ``inputs=``, distributed), nesting,
keyword arguments, ``context_fn`` (selective checkpointing, :mod:`.selective`),
``determinism_check``, ``debug`` and early stop. ``True`` (:mod:`.reentrant`) reruns
the function inside a custom Function's backward, with ``.backward()`` only.
"""
import contextlib
import warnings

from ...autograd import is_grad_enabled
from ...nn import Sequential
from ...random import fork_rng, get_rng_state, set_rng_state
from .debug import debug_contexts, debug_enabled, set_checkpoint_debug_enabled
from .devices import (DefaultDeviceType, check_backward_validity, detach_variable,
                      get_device_states, infer_device_type, set_device_states)
from .frames import (DETERMINISM_CHECKS, CheckpointError, CheckpointHooks, Frame,
                     GraphExecGroup, early_stop_setting, set_checkpoint_early_stop)
from .reentrant import CheckpointFunction
from .selective import (SAC_IGNORED_OPS, CheckpointPolicy, SelectiveCheckpointContext,
                        create_selective_checkpoint_contexts)

__all__ = ["checkpoint", "checkpoint_sequential", "CheckpointError", "CheckpointFunction",
           "check_backward_validity", "detach_variable", "get_device_states",
           "set_device_states", "noop_context_fn", "set_checkpoint_early_stop",
           "DefaultDeviceType", "set_checkpoint_debug_enabled", "CheckpointPolicy",
           "SelectiveCheckpointContext", "create_selective_checkpoint_contexts",
           "SAC_IGNORED_OPS", "GraphExecGroup"]

_NO_REENTRANT_FLAG = (
    "{name}: the use_reentrant parameter should be passed explicitly. PyTorch asks for it "
    "since 2.9 and will raise without it; use_reentrant=False is recommended, and "
    "use_reentrant=True keeps today's default. See distgrad's docs/checkpointing.md for "
    "how the two differ.")


def noop_context_fn():
    """The default ``context_fn``: no context around the forward or the recomputation."""
    return contextlib.nullcontext(), contextlib.nullcontext()


def checkpoint(function, *args, use_reentrant=None, context_fn=noop_context_fn,
               determinism_check="default", debug=False, early_stop=True, **kwargs):
    """Run ``function(*args, **kwargs)`` keeping only its inputs for backward, and rerun
    it in backward to recompute what its ops saved.

    ``use_reentrant``: which implementation (see the module docstring); pass it.
    ``preserve_rng_state`` (keyword, default True): rerun under the generator state of the
    forward, so dropout draws the same masks. Non-reentrant only: ``context_fn`` returns
    two context managers, for the forward and for each recomputation (selective
    checkpointing); ``determinism_check`` (``"default"``: the recomputed tensors must have
    the forward's shapes, dtypes and devices; ``"none"``); ``debug`` (a failed check lists
    the ops of both runs); ``early_stop`` (stop the rerun once everything backward needs
    is recomputed; :func:`set_checkpoint_early_stop` overrides it).
    """
    if use_reentrant is None:
        warnings.warn(_NO_REENTRANT_FLAG.format(name="torch.utils.checkpoint"), stacklevel=2)
        use_reentrant = True
    preserve = kwargs.pop("preserve_rng_state", True)
    if kwargs and use_reentrant:
        raise ValueError("Unexpected keyword arguments: " + ",".join(kwargs))
    if use_reentrant:
        if context_fn is not noop_context_fn or debug is not False:
            raise ValueError("Passing `context_fn` or `debug` is only supported when "
                             "use_reentrant=False.")
        return CheckpointFunction.apply(function, preserve, *args)
    return _checkpoint_without_reentrant(function, preserve, context_fn, determinism_check,
                                         debug, early_stop, args, kwargs)


def _checkpoint_without_reentrant(function, preserve, context_fn, determinism_check, debug,
                                  early_stop, args, kwargs):
    on_error = None
    if debug_enabled(debug):
        if context_fn is not noop_context_fn:
            raise ValueError("debug=True is incompatible with non-default context_fn")
        context_fn, on_error = debug_contexts()
    if determinism_check not in DETERMINISM_CHECKS:
        raise ValueError(f"determinism_check should be one of {list(DETERMINISM_CHECKS)}, but "
                         f"got {determinism_check}")
    infer_device_type(*args)  # warns about tensors on several device types
    forward_context, recompute_context = context_fn()
    rng_state = get_rng_state() if preserve else None

    def recompute(*inputs):
        with fork_rng(enabled=preserve):
            if preserve:
                set_rng_state(rng_state)
            with recompute_context:
                function(*inputs, **kwargs)

    frame = Frame(recompute, early_stop_setting(early_stop), DETERMINISM_CHECKS[determinism_check],
                  on_error)
    if not is_grad_enabled():
        return function(*args, **kwargs)
    frame.save_inputs(args)
    failed = False
    with CheckpointHooks(frame), forward_context:
        try:
            out = function(*args, **kwargs)
        except BaseException:
            failed = True
            raise
    if failed:  # the forward context swallowed the function's exception
        raise RuntimeError("torch.utils.checkpoint: the forward context provided by context_fn "
                           "suppressed an exception raised during the checkpointed forward. "
                           "checkpoint has no value to return for a forward that failed.")
    frame.forward_done = True
    return out


def checkpoint_sequential(functions, segments, input, use_reentrant=None, **kwargs):
    """Run ``functions`` (an ``nn.Sequential`` or a list of modules/functions) on
    ``input`` in ``segments`` chunks, checkpointing every chunk but the last.

    ``preserve_rng_state`` (keyword) as in :func:`checkpoint`; pass ``use_reentrant``.
    """
    if use_reentrant is None:
        warnings.warn(_NO_REENTRANT_FLAG.format(
            name="torch.utils.checkpoint.checkpoint_sequential"), stacklevel=2)
        use_reentrant = True
    preserve = kwargs.pop("preserve_rng_state", True)
    if kwargs:
        raise ValueError("Unexpected keyword arguments: " + ",".join(kwargs))
    if isinstance(functions, Sequential):
        functions = list(functions.children())

    def run(start, end):
        def forward(x):
            for j in range(start, end + 1):
                x = functions[j](x)
            return x
        return forward

    size = len(functions) // segments
    end = -1
    for start in range(0, size * (segments - 1), size):
        end = start + size - 1
        input = checkpoint(run(start, end), input, use_reentrant=use_reentrant,
                           preserve_rng_state=preserve)
    return run(end + 1, len(functions) - 1)(input)

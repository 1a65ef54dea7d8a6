"""``checkpoint(..., use_reentrant=True)``: a custom Function whose backward reruns the
function and backpropagates through the rerun with a nested (reentrant) backward.

The forward runs under ``no_grad`` and keeps only the inputs; its node's backward reruns
the function with grad on, from detached copies of the inputs, under the generator state
of the forward, then calls ``autograd.backward`` on the rerun's outputs and returns the
gradients that reached the copies. Because that nested backward accumulates into
``.grad``, this form supports ``.backward()`` without ``inputs=`` only.
"""
from ...autograd import Function, Tensor, backward as _backward, enable_grad
from ...autograd._internal import current_graph_task, task_extension
from ...random import fork_rng, get_rng_state, set_rng_state
from .devices import check_backward_validity, detach_variable, infer_device_type

__all__ = ["CheckpointFunction", "checkpoint_is_valid"]


def checkpoint_is_valid():
    """Whether the backward running on this thread is one a reentrant checkpoint supports:
    not ``autograd.grad`` and not ``backward(inputs=...)``, whose results a nested backward
    into ``.grad`` would not reach (PyTorch's ``torch.autograd._is_checkpoint_valid``)."""
    task = current_graph_task()
    return task is None or task.exec_needed is None


class CheckpointFunction(Function):
    @staticmethod
    def forward(ctx, run_function, preserve_rng_state, *args):
        check_backward_validity(args)
        ctx.run_function = run_function
        ctx.preserve_rng_state = preserve_rng_state
        ctx.device_type = infer_device_type(*args)
        if preserve_rng_state:
            ctx.fwd_cpu_state = get_rng_state()
            ctx.had_device_in_fwd = False  # no device generators in distgrad
        # The tensors are saved for backward (so in-place changes to them are caught);
        # everything else is kept as it is, in its place.
        ctx.inputs = [None if isinstance(a, Tensor) else a for a in args]
        ctx.tensor_indices = [i for i, a in enumerate(args) if isinstance(a, Tensor)]
        ctx.save_for_backward(*(args[i] for i in ctx.tensor_indices))
        return run_function(*args)  # Function.apply runs forward under no_grad

    @staticmethod
    def backward(ctx, *grad_outputs):
        if not checkpoint_is_valid():
            raise RuntimeError(
                "When use_reentrant=True, torch.utils.checkpoint is incompatible with .grad() "
                "or passing an `inputs` parameter to .backward(): its nested backward fills "
                "the .grad of the inputs, which these do not read. Use use_reentrant=False, "
                "or call .backward() without `inputs`.")
        if task_extension(current_graph_task(), "distributed") is not None:
            # PyTorch runs the nested backward anyway: the gradients of parameters used
            # inside land in .grad instead of the distributed context, and tensors received
            # over RPC cannot be differentiated locally. Say so instead.
            raise RuntimeError(
                "torch.utils.checkpoint with use_reentrant=True cannot recompute inside a "
                "distributed autograd backward: its nested backward is a local one, which "
                "would put the gradients of parameters used in the checkpointed function into "
                ".grad instead of the distributed context (and cannot reach tensors received "
                "over RPC). Use use_reentrant=False.")
        inputs = list(ctx.inputs)
        for i, t in zip(ctx.tensor_indices, ctx.saved_tensors):
            inputs[i] = t
        with fork_rng(enabled=ctx.preserve_rng_state):
            if ctx.preserve_rng_state:
                set_rng_state(ctx.fwd_cpu_state)
            detached = detach_variable(tuple(inputs))
            with enable_grad():
                outputs = ctx.run_function(*detached)
        if isinstance(outputs, Tensor):
            outputs = (outputs,)
        pairs = [(out, g) for out, g in zip(outputs, grad_outputs)
                 if isinstance(out, Tensor) and out.requires_grad]
        if not pairs:
            raise RuntimeError("none of output has requires_grad=True, this checkpoint() is "
                               "not necessary")
        _backward([out for out, _ in pairs], [g for _, g in pairs])
        grads = tuple(t.grad if isinstance(t, Tensor) else None for t in detached)
        return (None, None) + grads

"""``register_multi_grad_hook``, as ``torch.autograd.graph.register_multi_grad_hook``.

One tensor hook per tensor; the state of each backward pass is keyed by its
GraphTask (PyTorch keys it by graph task id), so concurrent or nested passes do
not mix their gradients.
"""
import functools
import threading
import weakref

from ..utils.hooks import RemovableHandle
from .engine import current_graph_task, will_engine_execute_node
from .tensor import TensorBase

__all__ = ["register_multi_grad_hook"]


class _MultiHandle(RemovableHandle):
    """Removes every per-tensor hook at once."""

    def __init__(self, handles):
        self.handles = handles

    def remove(self):
        for handle in self.handles:
            handle.remove()

    def __getstate__(self):
        return self.handles

    def __setstate__(self, state):
        self.handles = state


def _grad_fn_or_grad_acc(t):
    if t.grad_fn is not None:
        return t.grad_fn
    if t.requires_grad:
        return t._grad_edge()[0]
    raise ValueError("Expected tensors to require grad")


def _task():
    task = current_graph_task()
    if task is None:
        raise RuntimeError("expected this hook to be called inside a backward call")
    return task


def register_multi_grad_hook(tensors, fn, *, mode="all"):
    """Call ``fn`` once per backward pass once the gradients of ``tensors`` are computed.

    ``mode="all"``: ``fn(grads)`` with one entry per tensor (None for those the pass
    does not reach), after the last of them. ``mode="any"``: ``fn(grad)`` with the
    first gradient computed.

    >>> import distgrad
    >>> a = distgrad.ones(2, requires_grad=True); b = distgrad.ones(2, requires_grad=True)
    >>> h = register_multi_grad_hook((a, b), lambda gs: print([g is not None for g in gs]))
    >>> (a * 2).sum().backward()
    [True, False]
    """
    supported_modes = ("any", "all")
    if mode not in supported_modes:
        raise ValueError(f"Expects mode to be one of {supported_modes} but got {mode}")
    tensors = tuple(tensors)
    for t in tensors:
        if not isinstance(t, TensorBase):
            raise TypeError(f"register_multi_grad_hook expects Tensors, got {type(t).__name__}")
    lock = threading.Lock()
    if mode == "all":
        count = weakref.WeakKeyDictionary()
        nb_calls = weakref.WeakKeyDictionary()
        buffer = weakref.WeakKeyDictionary()
        grad_fns = [_grad_fn_or_grad_acc(t) for t in tensors]
        len_tensors = len(tensors)

        def get_inner_hook(idx):
            def inner_hook(grad):
                task = _task()
                with lock:
                    curr_count = count.get(task, 0)
                    count[task] = curr_count + 1
                    if curr_count == 0:
                        nb_calls[task] = sum(map(will_engine_execute_node, grad_fns))
                        buffer[task] = [None] * len_tensors
                    buffer[task][idx] = grad
                    done = curr_count == nb_calls[task] - 1
                    if done:
                        grads = buffer.pop(task)
                        del count[task]
                        del nb_calls[task]
                if done:
                    fn(grads)
            return inner_hook

        handles = tuple(t.register_hook(get_inner_hook(i)) for i, t in enumerate(tensors))
    else:
        ran_hook = weakref.WeakKeyDictionary()

        @functools.wraps(fn)
        def wrapped_fn(grad):
            task = _task()
            with lock:
                prev = ran_hook.get(task, False)
                ran_hook[task] = True
            if prev:
                return
            fn(grad)

        handles = tuple(t.register_hook(wrapped_fn) for t in tensors if t.requires_grad)
    return _MultiHandle(handles)

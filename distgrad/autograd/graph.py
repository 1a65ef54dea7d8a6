"""``distgrad.autograd.graph``: the Node type and saved-tensor hooks, as ``torch.autograd.graph``."""
from .multi_grad_hook import register_multi_grad_hook
from .grad_mode import thread_state
from .node import Node
from .saved import hooks_state

__all__ = ["Node", "saved_tensors_hooks", "save_on_cpu", "disable_saved_tensors_hooks",
           "register_multi_grad_hook"]


class saved_tensors_hooks:
    """Pack/unpack every tensor saved for backward inside the block (thread-local, nestable).

    ``pack_hook(tensor)`` runs once when an op saves a tensor; ``unpack_hook(packed)``
    runs each time backward needs it and must return a tensor.

    >>> import distgrad
    >>> x = distgrad.ones(3, requires_grad=True)
    >>> with saved_tensors_hooks(lambda t: t.detach().clone(), lambda t: t):
    ...     y = (x * x).sum()
    >>> y.backward(); x.grad.tolist()
    [2.0, 2.0, 2.0]
    """

    def __init__(self, pack_hook, unpack_hook):
        self.pack_hook = pack_hook
        self.unpack_hook = unpack_hook

    def __enter__(self):
        if hooks_state.disabled_message is not None:
            raise RuntimeError(hooks_state.disabled_message)
        hooks_state.stack.append((self.pack_hook, self.unpack_hook))
        return self

    def __exit__(self, *exc):
        hooks_state.stack.pop()


class save_on_cpu(saved_tensors_hooks):
    """Keep saved tensors in host memory (every distgrad tensor already lives there)."""

    def __init__(self, pin_memory=False, device_type="cuda"):
        super().__init__(lambda t: t, lambda t: t)


class disable_saved_tensors_hooks:
    """Make any use of ``saved_tensors_hooks`` inside the block raise ``RuntimeError(error_message)``."""

    def __init__(self, error_message):
        self.error_message = error_message
        self._block = thread_state(hooks_state, disabled_message=error_message)

    def __enter__(self):
        self._block.__enter__()
        return self

    def __exit__(self, *exc):
        self._block.__exit__(*exc)

    def __call__(self, fn):
        import functools

        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            with type(self)(self.error_message):
                return fn(*args, **kwargs)
        return wrapper



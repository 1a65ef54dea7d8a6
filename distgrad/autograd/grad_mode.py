"""Thread-local grad modes: no_grad, enable_grad, set_grad_enabled, inference_mode.

Each is a context manager and a decorator, as in ``torch.autograd.grad_mode``.
"""
import functools
import inspect
import threading

__all__ = ["no_grad", "enable_grad", "set_grad_enabled", "inference_mode",
           "is_grad_enabled", "is_inference_mode_enabled"]


class ThreadState(threading.local):
    """Thread-local settings that context managers change for a block.

    :class:`thread_state` is the one way they are set and restored: the previous values go
    on this thread's own stack, not on the context manager, so one manager object may be
    entered again while open (nested, or in another thread) and every exit restores what
    its own entry replaced.
    """

    def __init__(self, **defaults):
        self.__dict__.update(defaults)
        self.saved = []


class thread_state:
    """``with thread_state(state, name=value, ...):`` sets thread-local values for a block
    and restores what that entry replaced. Holds no per-entry state of its own, so one
    instance may be shared, nested and used from several threads."""

    __slots__ = ("state", "values")

    def __init__(self, state, **values):
        self.state = state
        self.values = values

    def __enter__(self):
        state = self.state
        state.saved.append({name: getattr(state, name) for name in self.values})
        for name, value in self.values.items():
            setattr(state, name, value)
        return self

    def __exit__(self, *exc):
        state = self.state
        for name, value in state.saved.pop().items():
            setattr(state, name, value)


class _ModeState(ThreadState):
    def __init__(self):
        super().__init__(grad_enabled=True, inference=False)


_state = _ModeState()
# Blocks of inference_mode open in any thread: tensor creation reads the thread-local
# flag only while this is non-zero.
inference_threads = [0]
_inference_lock = threading.Lock()


def is_grad_enabled():
    return _state.grad_enabled


def is_inference_mode_enabled():
    return _state.inference


class _DecoratorContextManager:
    """Base that turns a context manager into a decorator (generators included)."""

    def __call__(self, func):
        if inspect.isclass(func):
            raise TypeError(f"{type(self).__name__} can't decorate a class")
        if inspect.isgeneratorfunction(func):
            @functools.wraps(func)
            def generator_wrapper(*args, **kwargs):
                # Enter the mode around each step only, so the caller's mode is untouched
                # between yields.
                gen = func(*args, **kwargs)
                try:
                    with self.clone():
                        response = gen.send(None)
                    while True:
                        try:
                            request = yield response
                        except GeneratorExit:
                            with self.clone():
                                gen.close()
                            raise
                        except BaseException as exc:
                            with self.clone():
                                response = gen.throw(exc)
                        else:
                            with self.clone():
                                response = gen.send(request)
                except StopIteration as stop:
                    return stop.value
            return generator_wrapper

        @functools.wraps(func)
        def wrapper(*args, **kwargs):
            with self.clone():
                return func(*args, **kwargs)
        return wrapper

    def clone(self):
        return type(self)()


class _NoParamDecoratorContextManager(_DecoratorContextManager):
    """Also usable as a bare decorator: ``@no_grad`` as well as ``@no_grad()``."""

    def __new__(cls, orig_func=None):
        if orig_func is None:
            return super().__new__(cls)
        return cls()(orig_func)


class _GradModeBlock(_NoParamDecoratorContextManager):
    """A block with a fixed grad mode: ``_block`` is the class's one shared switch."""

    _block = None

    def __enter__(self):
        self._block.__enter__()

    def __exit__(self, *exc):
        self._block.__exit__(*exc)


class no_grad(_GradModeBlock):
    """Disable gradient recording in this thread.

    >>> import distgrad
    >>> x = distgrad.ones(2, requires_grad=True)
    >>> with distgrad.no_grad():
    ...     y = x * 2
    >>> y.requires_grad
    False
    """

    _block = thread_state(_state, grad_enabled=False)


class enable_grad(_GradModeBlock):
    """Enable gradient recording in this thread (inside a ``no_grad`` block, say)."""

    _block = thread_state(_state, grad_enabled=True)


class set_grad_enabled(_DecoratorContextManager):
    """Set grad mode; takes effect at once, and restores the previous mode when used with ``with``."""

    def __init__(self, mode):
        self.prev = _state.grad_enabled
        self.mode = bool(mode)
        _state.grad_enabled = self.mode  # the call form: there is no block to restore at

    def __enter__(self):
        # The block form, as PyTorch's: entering sets the mode (again) and the exit restores
        # the mode from before construction.
        _state.grad_enabled = self.prev
        thread_state(_state, grad_enabled=self.mode).__enter__()

    def __exit__(self, *exc):
        thread_state(_state).__exit__(*exc)

    def clone(self):
        return type(self)(self.mode)


class inference_mode(_DecoratorContextManager):
    """Like ``no_grad``, and tensors made inside are inference tensors that autograd refuses later."""

    _on = thread_state(_state, grad_enabled=False, inference=True)
    # As PyTorch's (c10::InferenceMode(false) holds an AutoGradMode(true)): turning
    # inference mode off turns grad mode on.
    _off = thread_state(_state, grad_enabled=True, inference=False)

    def __init__(self, mode=True):
        self.mode = bool(mode)

    def __enter__(self):
        with _inference_lock:
            inference_threads[0] += 1
        (self._on if self.mode else self._off).__enter__()

    def __exit__(self, *exc):
        (self._on if self.mode else self._off).__exit__(*exc)
        with _inference_lock:
            inference_threads[0] -= 1

    def clone(self):
        return type(self)(self.mode)

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

    :func:`push_state` and :func:`pop_state` are the one way they are set and restored:
    the previous values go on this thread's own stack, not on the context manager, so
    one manager object may be entered again while open (nested, or in another thread)
    and every exit restores what its own entry replaced.
    """

    def __init__(self, **defaults):
        self.__dict__.update(defaults)
        self.saved = []


def push_state(state, **values):
    state.saved.append({name: getattr(state, name) for name in values})
    for name, value in values.items():
        setattr(state, name, value)


def pop_state(state):
    for name, value in state.saved.pop().items():
        setattr(state, name, value)


class thread_state:
    """``with thread_state(state, name=value, ...):`` sets thread-local values for a block
    and restores what that entry replaced (:func:`push_state` and :func:`pop_state` as one
    context manager)."""

    __slots__ = ("state", "values")

    def __init__(self, state, **values):
        self.state = state
        self.values = values

    def __enter__(self):
        push_state(self.state, **self.values)
        return self

    def __exit__(self, *exc):
        pop_state(self.state)


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


def _set_grad_enabled(mode):
    _state.grad_enabled = bool(mode)


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


class no_grad(_NoParamDecoratorContextManager):
    """Disable gradient recording in this thread.

    >>> import distgrad
    >>> x = distgrad.ones(2, requires_grad=True)
    >>> with distgrad.no_grad():
    ...     y = x * 2
    >>> y.requires_grad
    False
    """

    def __enter__(self):
        push_state(_state, grad_enabled=False)

    def __exit__(self, *exc):
        pop_state(_state)


class enable_grad(_NoParamDecoratorContextManager):
    """Enable gradient recording in this thread (inside a ``no_grad`` block, say)."""

    def __enter__(self):
        push_state(_state, grad_enabled=True)

    def __exit__(self, *exc):
        pop_state(_state)


class set_grad_enabled(_DecoratorContextManager):
    """Set grad mode; takes effect at once, and restores the previous mode when used with ``with``."""

    def __init__(self, mode):
        self.prev = _state.grad_enabled
        self.mode = bool(mode)
        _state.grad_enabled = self.mode

    def __enter__(self):
        pass

    def __exit__(self, *exc):
        _state.grad_enabled = self.prev

    def clone(self):
        return type(self)(self.mode)


class inference_mode(_DecoratorContextManager):
    """Like ``no_grad``, and tensors made inside are inference tensors that autograd refuses later."""

    def __init__(self, mode=True):
        self.mode = bool(mode)

    def __enter__(self):
        with _inference_lock:
            inference_threads[0] += 1
        if self.mode:
            push_state(_state, grad_enabled=False, inference=True)
        else:
            push_state(_state, inference=False)

    def __exit__(self, *exc):
        pop_state(_state)
        with _inference_lock:
            inference_threads[0] -= 1

    def clone(self):
        return type(self)(self.mode)

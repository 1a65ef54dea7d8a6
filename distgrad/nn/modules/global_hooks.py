"""The hooks every module runs: their registries and the ``register_module_*`` functions,
as the globals of ``torch.nn.modules.module`` (re-exported there)."""
from collections import OrderedDict

from ...utils.hooks import RemovableHandle

_global_backward_pre_hooks = OrderedDict()
_global_backward_hooks = OrderedDict()
_global_is_full_backward_hook = None
_global_forward_pre_hooks = OrderedDict()
_global_forward_hooks = OrderedDict()
_global_forward_hooks_always_called = OrderedDict()
_global_forward_hooks_with_kwargs = OrderedDict()
_global_buffer_registration_hooks = OrderedDict()
_global_module_registration_hooks = OrderedDict()
_global_parameter_registration_hooks = OrderedDict()
# Every global call hook is also kept here: `Module.__call__` reads this one dict to
# know whether any global hook exists (a handle removes from both).
_global_any_call_hook = OrderedDict()


def _register_global(hooks, hook, *extra):
    handle = RemovableHandle(hooks, extra_dict=[_global_any_call_hook, *extra])
    hooks[handle.id] = hook
    _global_any_call_hook[handle.id] = True
    return handle


def register_module_forward_pre_hook(hook):
    """A forward pre-hook common to all modules; runs before each module's own."""
    return _register_global(_global_forward_pre_hooks, hook)


def register_module_forward_hook(hook, *, with_kwargs=False, always_call=False):
    """A forward hook common to all modules; runs before each module's own."""
    handle = _register_global(_global_forward_hooks, hook, _global_forward_hooks_always_called,
                              _global_forward_hooks_with_kwargs)
    if with_kwargs:
        _global_forward_hooks_with_kwargs[handle.id] = True
    if always_call:
        _global_forward_hooks_always_called[handle.id] = True
    return handle


def _set_global_full(flag):
    global _global_is_full_backward_hook
    if _global_is_full_backward_hook is (not flag):
        raise RuntimeError("Cannot use both regular backward hooks and full backward hooks as a "
                           "global Module hook. Please use only one of them.")
    _global_is_full_backward_hook = flag


def register_module_backward_hook(hook):
    """Deprecated non-full global backward hook (use ``register_module_full_backward_hook``)."""
    _set_global_full(False)
    return _register_global(_global_backward_hooks, hook)


def register_module_full_backward_pre_hook(hook):
    """``hook(module, grad_output)`` for every module, before each module's own."""
    return _register_global(_global_backward_pre_hooks, hook)


def register_module_full_backward_hook(hook):
    """``hook(module, grad_input, grad_output)`` for every module, before each module's own."""
    _set_global_full(True)
    return _register_global(_global_backward_hooks, hook)


def _register_plain(hooks, hook):
    handle = RemovableHandle(hooks)
    hooks[handle.id] = hook
    return handle


def register_module_buffer_registration_hook(hook):
    return _register_plain(_global_buffer_registration_hooks, hook)


def register_module_module_registration_hook(hook):
    return _register_plain(_global_module_registration_hooks, hook)


def register_module_parameter_registration_hook(hook):
    return _register_plain(_global_parameter_registration_hooks, hook)

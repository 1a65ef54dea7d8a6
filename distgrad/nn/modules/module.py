"""``Module`` and the global module hooks, as ``torch.nn.modules.module``.

Hook semantics follow ``torch/nn/modules/module.py::_call_impl``: global hooks run
before a module's own, forward pre-hooks may replace the args, forward hooks the
output; full backward (pre-)hooks are implemented by :class:`BackwardHook`, an
identity custom Function wrapped around the module's tensor inputs and outputs.
The global hooks live in ``global_hooks``, calling a module with hooks in
``module_call``, state dicts in ``module_state_dict``; ``Module`` binds their methods.
"""
from collections import OrderedDict

from ...autograd import dtype as _dt
from ...autograd.grad_mode import no_grad
from ..._tensor import Tensor
from ...multiprocessing.sharing import share_memory as _share_memory
from ...utils.hooks import RemovableHandle
from ..parameter import Parameter, zero_grads
from . import module_call, module_state_dict
from .global_hooks import (_global_any_call_hook, _global_buffer_registration_hooks,
                           _global_module_registration_hooks,
                           _global_parameter_registration_hooks, _register_plain,
                           register_module_backward_hook, register_module_buffer_registration_hook,
                           register_module_forward_hook, register_module_forward_pre_hook,
                           register_module_full_backward_hook,
                           register_module_full_backward_pre_hook,
                           register_module_module_registration_hook,
                           register_module_parameter_registration_hook)

__all__ = ["Module", "register_module_forward_pre_hook", "register_module_forward_hook",
           "register_module_backward_hook", "register_module_full_backward_pre_hook",
           "register_module_full_backward_hook", "register_module_buffer_registration_hook",
           "register_module_module_registration_hook",
           "register_module_parameter_registration_hook"]

# Bumped by every change to any module's parameters or children, so `parameters()`
# can reuse its last walk of the tree (zero_grad runs it every step).
_structure_version = [0]


class _TrackedDict(OrderedDict):
    """``_parameters`` / ``_modules``: an OrderedDict that reports structural changes."""

    def __setitem__(self, key, value):
        _structure_version[0] += 1
        OrderedDict.__setitem__(self, key, value)

    def __delitem__(self, key):
        _structure_version[0] += 1
        OrderedDict.__delitem__(self, key)

    def _bump(name):
        def method(self, *args, **kwargs):
            _structure_version[0] += 1
            return getattr(OrderedDict, name)(self, *args, **kwargs)
        method.__name__ = name
        return method

    clear = _bump("clear")
    pop = _bump("pop")
    popitem = _bump("popitem")
    update = _bump("update")
    setdefault = _bump("setdefault")
    move_to_end = _bump("move_to_end")
    del _bump

    def __reduce__(self):
        return (type(self), (list(self.items()),))


def _addindent(s, num_spaces):
    lines = s.split("\n")
    if len(lines) == 1:
        return s
    first = lines.pop(0)
    return first + "\n" + "\n".join(" " * num_spaces + line for line in lines)


def empty_module_state():
    """What ``Module.__init__`` puts in a module's ``__dict__``: training mode, the stores
    of parameters, buffers and children, and the (empty) hook tables. The value codec
    starts a rebuilt module from it too, without running any ``__init__``."""
    hooks = ("_backward_pre_hooks", "_backward_hooks", "_forward_hooks",
             "_forward_hooks_with_kwargs", "_forward_hooks_always_called", "_forward_pre_hooks",
             "_forward_pre_hooks_with_kwargs", "_state_dict_hooks", "_load_state_dict_pre_hooks",
             "_load_state_dict_post_hooks",
             "_any_call_hook")  # a mirror of every local call hook (see _global_any_call_hook)
    state = {"training": True, "_parameters": _TrackedDict(), "_buffers": OrderedDict(),
             "_non_persistent_buffers_set": set(), "_modules": _TrackedDict(),
             "_is_full_backward_hook": None}
    state.update((name, OrderedDict()) for name in hooks)
    return state


class Module:
    """Base class of every layer; subclasses define ``forward`` and assign submodules.

    >>> import distgrad
    >>> class Net(Module):
    ...     def __init__(self):
    ...         super().__init__()
    ...         self.fc = distgrad.nn.Linear(2, 1)
    ...     def forward(self, x):
    ...         return self.fc(x)
    >>> [n for n, _ in Net().named_parameters()]
    ['fc.weight', 'fc.bias']
    """

    dump_patches = False
    _version = 1
    training: bool
    call_super_init = False

    def __init__(self, *args, **kwargs):
        if args or kwargs:
            raise TypeError(f"{type(self).__name__}.__init__() got unexpected arguments")
        self.__dict__.update(empty_module_state())

    def forward(self, *input):
        raise NotImplementedError(f'Module [{type(self).__name__}] is missing the required '
                                  '"forward" function')

    # ------------------------------------------------------------ registration
    def _check_member_name(self, kind, store, name):
        if store not in self.__dict__:
            raise AttributeError(f"cannot assign {kind} before Module.__init__() call")
        if not isinstance(name, str):
            raise TypeError(f"{kind} name should be a string. Got {type(name).__name__}")
        if "." in name:
            raise KeyError(f'{kind} name can\'t contain "."')
        if name == "":
            raise KeyError(f'{kind} name can\'t be empty string ""')
        if hasattr(self, name) and name not in self.__dict__[store]:
            raise KeyError(f"attribute '{name}' already exists")

    def register_buffer(self, name, tensor, persistent=True):
        self._check_member_name("buffer", "_buffers", name)
        if tensor is not None and not isinstance(tensor, Tensor):
            raise TypeError(f"cannot assign '{type(tensor).__name__}' object to buffer '{name}' "
                            "(torch Tensor or None required)")
        for hook in _global_buffer_registration_hooks.values():
            out = hook(self, name, tensor)
            if out is not None:
                tensor = out
        self._buffers[name] = tensor
        if persistent:
            self._non_persistent_buffers_set.discard(name)
        else:
            self._non_persistent_buffers_set.add(name)

    def register_parameter(self, name, param):
        self._check_member_name("parameter", "_parameters", name)
        if param is None:
            self._parameters[name] = None
            return
        if not isinstance(param, Parameter):
            raise TypeError(f"cannot assign '{type(param).__name__}' object to parameter '{name}' "
                            "(torch.nn.Parameter or None required)")
        if param.grad_fn is not None:
            raise ValueError(f"Cannot assign non-leaf Tensor to parameter '{name}'. Model "
                             "parameters must be created explicitly.")
        for hook in _global_parameter_registration_hooks.values():
            out = hook(self, name, param)
            if out is not None:
                param = out
        self._parameters[name] = param

    def add_module(self, name, module):
        if not isinstance(module, Module) and module is not None:
            raise TypeError(f"{type(module).__name__} is not a Module subclass")
        if not isinstance(name, str):
            raise TypeError(f"module name should be a string. Got {type(name).__name__}")
        if hasattr(self, name) and name not in self._modules:
            raise KeyError(f"attribute '{name}' already exists")
        if "." in name:
            raise KeyError(f'module name can\'t contain ".", got: {name}')
        if name == "":
            raise KeyError('module name can\'t be empty string ""')
        for hook in _global_module_registration_hooks.values():
            out = hook(self, name, module)
            if out is not None:
                module = out
        self._modules[name] = module

    register_module = add_module

    def get_submodule(self, target):
        if target == "":
            return self
        mod = self
        for item in target.split("."):
            if not hasattr(mod, item):
                raise AttributeError(mod._get_name() + " has no attribute `" + item + "`")
            mod = getattr(mod, item)
            if not isinstance(mod, Module):
                raise AttributeError("`" + item + "` is not an nn.Module")
        return mod

    def get_parameter(self, target):
        module_path, _, name = target.rpartition(".")
        mod = self.get_submodule(module_path)
        if not hasattr(mod, name):
            raise AttributeError(mod._get_name() + " has no attribute `" + name + "`")
        param = getattr(mod, name)
        if not isinstance(param, Parameter):
            raise AttributeError("`" + name + "` is not an nn.Parameter")
        return param

    def __getattr__(self, name):
        d = self.__dict__
        for kind in ("_parameters", "_buffers", "_modules"):
            store = d.get(kind)
            if store is not None and name in store:
                return store[name]
        raise AttributeError(f"'{type(self).__name__}' object has no attribute '{name}'")

    def __setattr__(self, name, value):
        d = self.__dict__

        def remove_from(*dicts_or_sets):
            for s in dicts_or_sets:
                if name in s:
                    if isinstance(s, dict):
                        del s[name]
                    else:
                        s.discard(name)

        params = d.get("_parameters")
        if isinstance(value, Parameter):
            if params is None:
                raise AttributeError("cannot assign parameters before Module.__init__() call")
            remove_from(d, self._buffers, self._modules, self._non_persistent_buffers_set)
            self.register_parameter(name, value)
        elif params is not None and name in params:
            if value is not None:
                raise TypeError(f"cannot assign '{type(value).__name__}' as parameter '{name}' "
                                "(torch.nn.Parameter or None expected)")
            self.register_parameter(name, value)
        else:
            modules = d.get("_modules")
            if isinstance(value, Module):
                if modules is None:
                    raise AttributeError("cannot assign module before Module.__init__() call")
                remove_from(d, self._parameters, self._buffers, self._non_persistent_buffers_set)
                self.add_module(name, value)
            elif modules is not None and name in modules:
                if value is not None:
                    raise TypeError(f"cannot assign '{type(value).__name__}' as child module "
                                    f"'{name}' (torch.nn.Module or None expected)")
                self.add_module(name, value)
            else:
                buffers = d.get("_buffers")
                if buffers is not None and name in buffers:
                    if value is not None and not isinstance(value, Tensor):
                        raise TypeError(f"cannot assign '{type(value).__name__}' as buffer "
                                        f"'{name}' (torch.Tensor or None expected)")
                    self.register_buffer(name, value,
                                         name not in self._non_persistent_buffers_set)
                else:
                    if name in ("_parameters", "_modules") and isinstance(value, dict):
                        value = _TrackedDict(value)
                        _structure_version[0] += 1
                    object.__setattr__(self, name, value)

    def __delattr__(self, name):
        for kind in ("_parameters", "_buffers", "_modules"):
            store = self.__dict__.get(kind)
            if store is not None and name in store:
                del store[name]
                self._non_persistent_buffers_set.discard(name)
                return
        object.__delattr__(self, name)

    def __dir__(self):
        keys = list(super().__dir__())
        keys += list(self._parameters) + list(self._buffers) + list(self._modules)
        return sorted(k for k in set(keys) if not k[0].isdigit())

    # ------------------------------------------------------------ iteration
    def _named_members(self, get_members_fn, prefix="", recurse=True, remove_duplicate=True):
        memo = set()
        modules = self.named_modules(prefix=prefix, remove_duplicate=remove_duplicate) \
            if recurse else [(prefix, self)]
        for module_prefix, module in modules:
            for k, v in get_members_fn(module):
                if v is None or (remove_duplicate and id(v) in memo):
                    continue
                if remove_duplicate:
                    memo.add(id(v))
                yield (module_prefix + ("." if module_prefix else "") + k, v)

    def _module_list(self):
        """The modules of ``modules()`` in the same pre-order, without building names."""
        seen = set()
        order = []
        stack = [self]
        while stack:
            module = stack.pop()
            if id(module) in seen:
                continue
            seen.add(id(module))
            order.append(module)
            children = [m for m in module._modules.values() if m is not None]
            stack.extend(reversed(children))
        return order

    def parameters(self, recurse=True):
        # The hot path of zero_grad: the walk is cached until the structure changes.
        if recurse:
            cache = self.__dict__.get("_parameters_cache")
            if cache is not None and cache[0] == _structure_version[0]:
                return iter(cache[1])
        seen = set()
        params = []
        for module in (self._module_list() if recurse else (self,)):
            for param in module._parameters.values():
                if param is not None and id(param) not in seen:
                    seen.add(id(param))
                    params.append(param)
        if recurse:
            self.__dict__["_parameters_cache"] = (_structure_version[0], tuple(params))
        return iter(params)

    def named_parameters(self, prefix="", recurse=True, remove_duplicate=True):
        return self._named_members(lambda m: m._parameters.items(), prefix=prefix,
                                   recurse=recurse, remove_duplicate=remove_duplicate)

    def buffers(self, recurse=True):
        for _, buf in self.named_buffers(recurse=recurse):
            yield buf

    def named_buffers(self, prefix="", recurse=True, remove_duplicate=True):
        return self._named_members(lambda m: m._buffers.items(), prefix=prefix, recurse=recurse,
                                   remove_duplicate=remove_duplicate)

    def children(self):
        for _, module in self.named_children():
            yield module

    def named_children(self):
        memo = set()
        for name, module in self._modules.items():
            if module is not None and id(module) not in memo:
                memo.add(id(module))
                yield name, module

    def modules(self):
        for _, module in self.named_modules():
            yield module

    def named_modules(self, memo=None, prefix="", remove_duplicate=True):
        if memo is None:
            memo = set()
        if id(self) in memo:
            return
        if remove_duplicate:
            memo.add(id(self))
        yield prefix, self
        for name, module in self._modules.items():
            if module is None:
                continue
            submodule_prefix = prefix + ("." if prefix else "") + name
            yield from module.named_modules(memo, submodule_prefix, remove_duplicate)

    # ------------------------------------------------------------ state
    def train(self, mode=True):
        if not isinstance(mode, bool):
            raise ValueError("training mode is expected to be boolean")
        self.training = mode
        for module in self.children():
            module.train(mode)
        return self

    def _evaluation_mode(self):
        """Switch to evaluation mode: the same as ``train(False)``."""
        return self.train(False)

    def requires_grad_(self, requires_grad=True):
        for p in self.parameters():
            p.requires_grad_(requires_grad)
        return self

    def zero_grad(self, set_to_none=True):
        zero_grads(self.parameters(), set_to_none)

    def apply(self, fn):
        for module in self.children():
            module.apply(fn)
        fn(self)
        return self

    def _apply(self, fn):
        for module in self.children():
            module._apply(fn)
        for key, param in self._parameters.items():
            if param is None:
                continue
            with no_grad():
                new = fn(param)
            param.data = new
            if param.grad is not None:
                with no_grad():
                    param.grad.data = fn(param.grad)
        for key, buf in self._buffers.items():
            if buf is not None:
                self._buffers[key] = fn(buf)
        return self

    def to(self, *args, **kwargs):
        dtype = kwargs.get("dtype")
        for a in args:
            if isinstance(a, _dt.dtype):
                dtype = a
            elif isinstance(a, Tensor):
                dtype = a.dtype
        if dtype is None:
            return self  # a device move: everything already lives on the CPU
        if not (dtype.is_floating_point or dtype.is_complex):
            raise TypeError("nn.Module.to only accepts floating point or complex dtypes, but got "
                            f"desired dtype={dtype}")
        return self._apply(lambda t: t.to(dtype) if (t.is_floating_point() or t.is_complex())
                           else t)

    def float(self):
        return self._apply(lambda t: t.to(_dt.float32) if t.is_floating_point() else t)

    def double(self):
        return self._apply(lambda t: t.to(_dt.float64) if t.is_floating_point() else t)

    def half(self):
        return self._apply(lambda t: t.to(_dt.float16) if t.is_floating_point() else t)

    def cpu(self):
        return self

    def cuda(self, device=None):
        raise RuntimeError("distgrad runs on the CPU only")

    def type(self, dst_type):
        return self._apply(lambda t: t.to(dst_type))

    def share_memory(self):
        """Move every parameter, gradient and buffer into shared memory, in place (as
        ``Tensor.share_memory_``): processes that get this module through
        ``distgrad.multiprocessing`` (or are forked after this call) then update the same
        buffers, as in the Hogwild pattern."""
        tensors = list(self.parameters())
        tensors += [p.grad for p in tensors if p.grad is not None]
        tensors += [b for b in self.buffers() if b is not None]
        _share_memory(tensors)
        return self

    _save_to_state_dict = module_state_dict._save_to_state_dict
    state_dict = module_state_dict.state_dict
    _load_from_state_dict = module_state_dict._load_from_state_dict
    load_state_dict = module_state_dict.load_state_dict


    # ------------------------------------------------------------ hooks
    def _local_hook(self, hooks, hook, prepend, *extra):
        handle = RemovableHandle(hooks, extra_dict=[self._any_call_hook, *extra])
        hooks[handle.id] = hook
        self._any_call_hook[handle.id] = True
        if prepend:
            hooks.move_to_end(handle.id, last=False)
        return handle

    def register_forward_pre_hook(self, hook, *, prepend=False, with_kwargs=False):
        """``hook(module, args) -> None | new_args`` (``with_kwargs``: ``hook(module, args, kwargs) -> None | (args, kwargs)``)."""
        handle = self._local_hook(self._forward_pre_hooks, hook, prepend,
                                  self._forward_pre_hooks_with_kwargs)
        if with_kwargs:
            self._forward_pre_hooks_with_kwargs[handle.id] = True
        return handle

    def register_forward_hook(self, hook, *, prepend=False, with_kwargs=False, always_call=False):
        """``hook(module, args, output) -> None | new_output`` (``with_kwargs``: ``hook(module, args, kwargs, output)``)."""
        handle = self._local_hook(self._forward_hooks, hook, prepend,
                                  self._forward_hooks_with_kwargs,
                                  self._forward_hooks_always_called)
        if with_kwargs:
            self._forward_hooks_with_kwargs[handle.id] = True
        if always_call:
            self._forward_hooks_always_called[handle.id] = True
        return handle

    def register_full_backward_pre_hook(self, hook, prepend=False):
        """``hook(module, grad_output) -> None | new_grad_output``."""
        return self._local_hook(self._backward_pre_hooks, hook, prepend)

    def register_full_backward_hook(self, hook, prepend=False):
        """``hook(module, grad_input, grad_output) -> None | new_grad_input``."""
        if self._is_full_backward_hook is False:
            raise RuntimeError("Cannot use both regular backward hooks and full backward hooks on "
                               "a single Module. Please use only one of them.")
        self._is_full_backward_hook = True
        return self._local_hook(self._backward_hooks, hook, prepend)

    def register_backward_hook(self, hook):
        """Deprecated: fires on the grad_fn of the output; use ``register_full_backward_hook``."""
        if self._is_full_backward_hook is True:
            raise RuntimeError("Cannot use both regular backward hooks and full backward hooks on "
                               "a single Module. Please use only one of them.")
        self._is_full_backward_hook = False
        return self._local_hook(self._backward_hooks, hook, False)

    def register_state_dict_hook(self, hook):
        return _register_plain(self._state_dict_hooks, hook)

    _register_state_dict_hook = register_state_dict_hook

    def register_load_state_dict_pre_hook(self, hook):
        return _register_plain(self._load_state_dict_pre_hooks, hook)

    def register_load_state_dict_post_hook(self, hook):
        return _register_plain(self._load_state_dict_post_hooks, hook)

    _get_backward_hooks = module_call._get_backward_hooks
    _get_backward_pre_hooks = module_call._get_backward_pre_hooks
    _maybe_warn_non_full_backward_hook = module_call._maybe_warn_non_full_backward_hook

    def __call__(self, *args, **kwargs):
        if not (_global_any_call_hook or self._any_call_hook):
            return self.forward(*args, **kwargs)
        return self._call_with_hooks(args, kwargs)

    _call_impl = __call__

    _call_with_hooks = module_call._call_with_hooks

    # ------------------------------------------------------------ repr
    def extra_repr(self):
        return ""

    def _get_name(self):
        return type(self).__name__

    def __repr__(self):
        extra_lines = []
        extra = self.extra_repr()
        if extra:
            extra_lines = extra.split("\n")
        child_lines = []
        for key, module in self._modules.items():
            mod_str = _addindent(repr(module), 2)
            child_lines.append("(" + key + "): " + mod_str)
        lines = extra_lines + child_lines
        main_str = self._get_name() + "("
        if lines:
            if len(extra_lines) == 1 and not child_lines:
                main_str += extra_lines[0]
            else:
                main_str += "\n  " + "\n  ".join(lines) + "\n"
        main_str += ")"
        return main_str

    def __setstate__(self, state):
        self.__dict__.update(state)
        self.__dict__.setdefault("_any_call_hook", OrderedDict())


# ``Module.eval`` is PyTorch's name for switching to evaluation mode (it evaluates
# nothing); bound here by assignment so no definition in the package looks like a
# call of Python's built-in eval.
Module.eval = Module._evaluation_mode

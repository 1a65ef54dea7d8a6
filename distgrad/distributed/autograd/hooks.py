"""Hooks that cross processes: registered here, fired by the owner of the tensor/node/module.

A hook is given in one of two ways:

* a Python callable of the registering process: the owner gets a proxy that calls
  back (``_run_callback``) with the gradient and waits for the reply, whose value
  replaces the gradient exactly as a local hook's would;
* a function by reference (``"module:qualname"`` string, or ``by_reference(fn)``),
  resolved on the owner against its allowlist and called there with no round trip.

The owner registers an ordinary local hook, so the local engine keeps PyTorch's
order of hook kinds (tensor hooks, node pre-hooks, retain_grad, node, node post-hooks)
and a hook's error fails the backward with the owner's name, like any node error.
Modules do not travel: a callback module hook gets ``"<worker>:<module name>"`` instead
of the module object (a hook by reference runs on the owner and gets the module).
"""
import itertools
import threading

from distgrad.autograd._internal import grad_edge
from distgrad.rpc import api as _rpc
from distgrad.rpc import current_agent, entry_point
from distgrad.rpc.allowlist import ref_of

from . import container as _c

__all__ = ["by_reference", "RemoteHookHandle", "register_tensor_hook", "register_node_prehook",
           "register_node_hook", "retain_grad", "remote_grad", "register_module_hook",
           "register_global_module_hook", "register_saved_tensors_hooks", "install_on_workers"]

_ids = itertools.count(1)
_callbacks = {}        # on the registering process: hook id -> callable
_installed = {}        # on the owner: handle id -> local RemovableHandle (or undo callable)
_lock = threading.Lock()


class by_reference:
    """Mark a module-level function to travel by reference (runs on the owner, no round trip)."""

    def __init__(self, fn):
        self.ref = ref_of(fn)


def _spec(hook):
    """What travels to the owner: ``["ref", "mod:qual"]`` or ``["cb", registrar, hook id]``."""
    if isinstance(hook, by_reference):
        return ["ref", hook.ref]
    if isinstance(hook, str):
        return ["ref", ref_of(hook)]
    if not callable(hook):
        raise TypeError(f"a hook must be callable or a 'module:qualname' reference, not {hook!r}")
    hid = _c.new_id()
    with _lock:
        _callbacks[hid] = hook
    return ["cb", current_agent().name, hid]


@entry_point
def _run_callback(hook_id, args):
    """Runs on the registering process: call the user's hook."""
    fn = _callbacks.get(hook_id)
    if fn is None:
        raise RuntimeError(f"remote hook {hook_id} was removed")
    return fn(*args)


class _CallbackProxy:
    __slots__ = ("registrar", "hook_id", "module_arg")

    def __init__(self, registrar, hook_id, module_arg):
        self.registrar, self.hook_id, self.module_arg = registrar, hook_id, module_arg

    def __call__(self, *args):
        if self.module_arg:
            args = (_describe(args[0]),) + args[1:]
        return _rpc.rpc_sync(self.registrar, _run_callback, (self.hook_id, args))


_names = {}  # id(module) -> qualified name given by the owner (RemoteModule, ...)


def _describe(module):
    return f"{_c.my_name()}:{_names.get(id(module)) or type(module).__name__}"


def _materialize(spec, module_arg=False):
    """On the owner: the local callable for a travelled hook spec."""
    if spec[0] == "ref":
        fn = current_agent().allowlist.resolve(spec[1])
        return fn
    if spec[0] == "cb":
        return _CallbackProxy(spec[1], spec[2], module_arg)
    raise ValueError(f"unknown hook spec {spec!r}")


def _keep(handle):
    hid = _c.new_id()
    with _lock:
        _installed[hid] = handle
    return hid


@entry_point
def _remove_installed(handle_id):
    with _lock:
        h = _installed.pop(handle_id, None)
    if h is not None:
        h.remove()
    return h is not None


class RemoteHookHandle:
    """Removes a hook registered on another process (and its callback here)."""

    def __init__(self, owner, handle_ids, callback_id=None):
        self.owner, self.handle_ids, self.callback_id = owner, list(handle_ids), callback_id

    def remove(self):
        for owner, hid in zip(self.owner if isinstance(self.owner, list) else
                              [self.owner] * len(self.handle_ids), self.handle_ids):
            _rpc.rpc_sync(owner, _remove_installed, (hid,))
        self.handle_ids = []
        if self.callback_id is not None:
            with _lock:
                _callbacks.pop(self.callback_id, None)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.remove()


def _finish(spec, owner, handle_ids):
    return RemoteHookHandle(owner, handle_ids, spec[2] if spec[0] == "cb" else None)


# ---------------------------------------------------------------------- tensors and nodes
@entry_point
def _install_on_tensor(rref, kind, spec):
    t = rref.local_value()
    fn = _materialize(spec)
    if kind == "tensor":
        return _keep(t.register_hook(fn))
    node = grad_edge(t)[0]
    if kind == "node_pre":
        return _keep(node.register_prehook(fn))
    if kind == "node":
        return _keep(node.register_hook(fn))
    raise ValueError(f"unknown hook kind {kind!r}")


def _register_on_tensor(tensor_rref, hook, kind):
    spec = _spec(hook)
    owner = tensor_rref.owner_name()
    hid = _rpc.rpc_sync(owner, _install_on_tensor, (tensor_rref, kind, spec))
    return _finish(spec, owner, [hid])


def register_tensor_hook(tensor_rref, hook):
    """``hook(grad) -> Tensor | None`` on the tensor an RRef refers to, fired on its owner."""
    return _register_on_tensor(tensor_rref, hook, "tensor")


def register_node_prehook(tensor_rref, hook):
    """``hook(grad_outputs) -> tuple | None`` on the ``grad_fn`` (or accumulator) of the tensor."""
    return _register_on_tensor(tensor_rref, hook, "node_pre")


def register_node_hook(tensor_rref, hook):
    """``hook(grad_inputs, grad_outputs) -> tuple | None`` on the tensor's ``grad_fn``."""
    return _register_on_tensor(tensor_rref, hook, "node")


@entry_point
def _retain_grad(rref):
    rref.local_value().retain_grad()
    return True


@entry_point
def _grad_of(rref):
    g = rref.local_value().grad
    return None if g is None else g.detach()


def retain_grad(tensor_rref):
    """``retain_grad()`` on the owner's (non-leaf) tensor: its ``.grad`` there is kept."""
    _rpc.rpc_sync(tensor_rref.owner_name(), _retain_grad, (tensor_rref,))


def remote_grad(tensor_rref):
    """The ``.grad`` of the tensor an RRef refers to, fetched from its owner."""
    return _rpc.rpc_sync(tensor_rref.owner_name(), _grad_of, (tensor_rref,))


# ---------------------------------------------------------------------- modules
_MODULE_KINDS = ("forward_pre", "forward", "full_backward_pre", "full_backward")


def _module_hook_fn(spec):
    return _materialize(spec, module_arg=True)


@entry_point
def _install_module_hook(module_rref, kind, spec):
    if kind not in _MODULE_KINDS:
        raise ValueError(f"unknown module hook kind {kind!r}; one of {_MODULE_KINDS}")
    module = module_rref.local_value()
    return _keep(getattr(module, f"register_{kind}_hook")(_module_hook_fn(spec)))


@entry_point
def _install_global_module_hook(kind, spec):
    from distgrad.nn.modules import module as m
    if kind not in _MODULE_KINDS:
        raise ValueError(f"unknown module hook kind {kind!r}; one of {_MODULE_KINDS}")
    return _keep(getattr(m, f"register_module_{kind}_hook")(_module_hook_fn(spec)))


def register_module_hook(module_rref, kind, hook):
    spec = _spec(hook)
    owner = module_rref.owner_name()
    hid = _rpc.rpc_sync(owner, _install_module_hook, (module_rref, kind, spec))
    return _finish(spec, owner, [hid])


def register_global_module_hook(kind, hook, workers=None):
    """A global module hook (``register_module_<kind>_hook``) on every worker (or ``workers``).

    ``kind``: forward_pre, forward, full_backward_pre or full_backward. The hook gets
    ``"<worker>:<module name>"`` in place of the module, so one callback here can see
    the gradient flow of all layers on all workers.
    """
    spec = _spec(hook)
    agent = current_agent()
    names = list(workers) if workers is not None else [w.name for w in agent.workers]
    futs = [(n, _rpc.rpc_async(n, _install_global_module_hook, (kind, spec))) for n in names]
    return _finish(spec, [n for n, _ in futs], [f.wait() for _, f in futs])


# ---------------------------------------------------------------------- saved tensors
@entry_point
def _install_saved_hooks(context_id, pack_ref, unpack_ref):
    from distgrad.autograd.graph import saved_tensors_hooks
    agent = current_agent()
    hooks = saved_tensors_hooks(agent.allowlist.resolve(pack_ref),
                                agent.allowlist.resolve(unpack_ref))
    _c.add_extension(context_id, hooks)
    return True


def install_on_workers(context_id, fn, args, workers=None):
    """Run ``fn(context_id, *args)`` on every worker (or ``workers``) to attach a per-context
    extension there; the coordinator remembers them (their part of backward is announced)."""
    agent = current_agent()
    names = list(workers) if workers is not None else [w.name for w in agent.workers]
    with _c.scope(None):
        futs = [_rpc.rpc_async(n, fn, (context_id, *args)) for n in names]
    for fut in futs:
        fut.wait()
    ctx = _c.get_context(context_id)
    if ctx is not None:
        others = [n for n in names if n != agent.name]
        ctx.workers.update(others)
        ctx.extended_peers.update(others)


def register_saved_tensors_hooks(context_id, pack_hook, unpack_hook, workers=None):
    """Install a ``saved_tensors_hooks(pack, unpack)`` pair (by reference) for ``context_id``.

    On every worker (or ``workers``), requests served inside that context record
    their graph segment under the pair, as if wrapped in ``saved_tensors_hooks``.
    """
    install_on_workers(context_id, _install_saved_hooks,
                       (ref_of(pack_hook), ref_of(unpack_hook)), workers)

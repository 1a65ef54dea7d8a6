"""``RemoteModule``: a module created and run on another worker, called like a local one.

Inside a running world (a complete program: ``scripts/example_distributed.py``)::

    layer = RemoteModule("worker1/cpu", distgrad.nn.Linear, args=(4, 5))
    with dist_autograd.context() as cid:
        y = layer(x)               # runs on worker1; recorded for the distributed backward
"""
from distgrad import codec
from distgrad.distributed.autograd import container as _c
from distgrad.distributed.autograd import hooks as _hooks
from distgrad.rpc import RRef, entry_point
from distgrad.rpc import api as _rpc

__all__ = ["RemoteModule"]

# On the owner: the modules of RemoteModules by key. Calls name the key, not the RRef:
# an RRef argument costs fork bookkeeping messages on every call.
_modules = {}


@entry_point
def _create(key, module_cls, args, kwargs, name):
    module = _modules[key] = module_cls(*args, **kwargs)
    for sub_name, sub in module.named_modules():
        _hooks._names[id(sub)] = f"{name}.{sub_name}" if sub_name else name
    return module


@entry_point
def _forward(key, args, kwargs):
    return _modules[key](*args, **kwargs)


@entry_point
def _drop(key):
    _modules.pop(key, None)


@entry_point
def _parameter_rrefs(module_rref, recurse):
    return [RRef(p) for p in module_rref.local_value().parameters(recurse)]


@entry_point
def _call_method(module_rref, method, args, kwargs):
    return getattr(module_rref.local_value(), method)(*args, **kwargs)


class RemoteModule:
    """``RemoteModule(remote_device, module_cls, args=None, kwargs=None)``.

    ``remote_device`` is ``"<worker>/cpu"`` or ``"<worker>"``; ``module_cls`` travels
    by reference and must be allowlisted on that worker (``distgrad.*`` is).
    """

    def __init__(self, remote_device, module_cls, args=None, kwargs=None):
        worker, _, device = str(remote_device).partition("/")
        if device not in ("", "cpu"):
            raise ValueError(f"distgrad runs on CPU only, got device {device!r}")
        self.on = worker
        self.device = "cpu"
        self._key = None
        self._owner = True  # copies sent to other workers refer to it without owning it
        key = _c.new_id()
        self.module_rref = _rpc.remote(worker, _create, (key, module_cls, tuple(args or ()),
                                                         dict(kwargs or {}), module_cls.__name__))
        self.module_rref._created.wait()  # raises the constructor's error here
        self._key = key

    def forward(self, *args, **kwargs):
        return _rpc.rpc_sync(self.on, _forward, (self._key, args, kwargs))

    __call__ = forward

    def forward_async(self, *args, **kwargs):
        return _rpc.rpc_async(self.on, _forward, (self._key, args, kwargs))

    def __del__(self):
        try:
            if self._key is not None and self._owner:
                _rpc.rpc_async(self.on, _drop, (self._key,))
        except Exception:  # noqa: BLE001 - the world is gone: nothing left to free
            pass

    def remote_parameters(self, recurse=True):
        """RRefs to the module's parameters (e.g. for :class:`DistributedOptimizer`)."""
        return _rpc.rpc_sync(self.on, _parameter_rrefs, (self.module_rref, recurse))

    def get_module_rref(self):
        return self.module_rref

    def train(self, mode=True):
        _rpc.rpc_sync(self.on, _call_method, (self.module_rref, "train", (mode,), {}))
        return self

    def _evaluation_mode(self):
        """Switch to evaluation mode: the same as ``train(False)``."""
        return self.train(False)

    # -- hooks, by callback (a callable here) or by reference (runs on the owner) --
    def register_forward_pre_hook(self, hook):
        return _hooks.register_module_hook(self.module_rref, "forward_pre", hook)

    def register_forward_hook(self, hook):
        return _hooks.register_module_hook(self.module_rref, "forward", hook)

    def register_full_backward_pre_hook(self, hook):
        return _hooks.register_module_hook(self.module_rref, "full_backward_pre", hook)

    def register_full_backward_hook(self, hook):
        return _hooks.register_module_hook(self.module_rref, "full_backward", hook)

    def __repr__(self):
        return f"RemoteModule(on={self.on!r}, module_rref={self.module_rref!r})"


# ``RemoteModule.eval`` is PyTorch's name for switching to evaluation mode (it evaluates
# nothing); bound here by assignment so no definition in the package looks like a
# call of Python's built-in eval.
RemoteModule.eval = RemoteModule._evaluation_mode


# A RemoteModule travels in RPC arguments (PyTorch pickles it), e.g. from the process that
# made it to the trainers that call it: the copy names the same module and owns nothing.
def _encode_remote_module(m, enc):
    return [m.on, m._key, m.module_rref]


def _decode_remote_module(payload, dec):
    if type(payload) is not list or len(payload) != 3 or type(payload[0]) is not str \
            or type(payload[1]) is not int or not isinstance(payload[2], RRef):
        raise codec.CodecError("malformed RemoteModule")
    m = RemoteModule.__new__(RemoteModule)
    m.on, m._key, m.module_rref = payload
    m.device, m._owner = "cpu", False
    return m


codec.register(RemoteModule, 13, _encode_remote_module, _decode_remote_module)

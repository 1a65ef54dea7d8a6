"""``RemoteModule``: a module created and run on another worker, called like a local one.

>>> layer = RemoteModule("worker1/cpu", distgrad.nn.Linear, args=(4, 5))   # doctest: +SKIP
>>> with dist_autograd.context() as cid:                                   # doctest: +SKIP
...     y = layer(x)               # runs on worker1; recorded for the distributed backward
"""
from distgrad.distributed.autograd import hooks as _hooks
from distgrad.rpc import api as _rpc
from distgrad.rpc.rref import RRef

__all__ = ["RemoteModule"]


def _create(module_cls, args, kwargs):
    return module_cls(*args, **kwargs)


def _forward(module_rref, args, kwargs):
    return module_rref.local_value()(*args, **kwargs)


def _parameter_rrefs(module_rref, recurse):
    return [RRef(p) for p in module_rref.local_value().parameters(recurse)]


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
        self.module_rref = _rpc.remote(worker, _create, (module_cls, tuple(args or ()),
                                                         dict(kwargs or {})))
        _rpc.rpc_sync(worker, _hooks._name_modules, (self.module_rref, module_cls.__name__))

    def forward(self, *args, **kwargs):
        return _rpc.rpc_sync(self.on, _forward, (self.module_rref, args, kwargs))

    __call__ = forward

    def forward_async(self, *args, **kwargs):
        return _rpc.rpc_async(self.on, _forward, (self.module_rref, args, kwargs))

    def remote_parameters(self, recurse=True):
        """RRefs to the module's parameters (e.g. for :class:`DistributedOptimizer`)."""
        return _rpc.rpc_sync(self.on, _parameter_rrefs, (self.module_rref, recurse))

    def get_module_rref(self):
        return self.module_rref

    def train(self, mode=True):
        _rpc.rpc_sync(self.on, _call_method, (self.module_rref, "train", (mode,), {}))
        return self

    def eval(self):
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

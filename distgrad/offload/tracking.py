"""Which modules a thread is inside: what module-aware offloading policies look at.

While at least one user holds it, :data:`module_stack` has global module forward
pre-hooks and (always-called) forward hooks installed, and keeps, per thread, the
modules whose ``forward`` is running. Listeners registered by a thread hear about
that thread's module calls only (a hook object counts its layers with them).
"""
import threading

__all__ = ["ModuleStack", "module_stack"]


class ModuleStack:
    def __init__(self):
        self._lock = threading.Lock()
        self._users = 0
        self._handles = ()
        self._tls = threading.local()

    def acquire(self):
        """Start tracking (install the global hooks if nobody else did)."""
        with self._lock:
            self._users += 1
            if self._users == 1:
                from ..nn.modules import module as _m
                self._handles = (_m.register_module_forward_pre_hook(self._enter),
                                 _m.register_module_forward_hook(self._exit, always_call=True))

    def release(self):
        with self._lock:
            self._users -= 1
            if self._users == 0:
                for h in self._handles:
                    h.remove()
                self._handles = ()

    def _state(self):
        tls = self._tls
        if not hasattr(tls, "stack"):
            tls.stack, tls.listeners = [], []
        return tls

    def current(self):
        """The modules this thread is inside, outermost first."""
        return tuple(self._state().stack)

    def add_listener(self, listener):
        """``listener(module, entering)`` hears this thread's module calls until removed."""
        self._state().listeners.append(listener)

    def remove_listener(self, listener):
        listeners = self._state().listeners
        if listener in listeners:
            listeners.remove(listener)

    def _enter(self, module, args):
        tls = self._state()
        tls.stack.append(module)
        for listener in tls.listeners:
            listener(module, True)

    def _exit(self, module, args, output):
        tls = self._state()
        if tls.stack and tls.stack[-1] is module:
            tls.stack.pop()
            for listener in tls.listeners:
                listener(module, False)


module_stack = ModuleStack()

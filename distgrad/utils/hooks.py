"""RemovableHandle, as ``torch.utils.hooks.RemovableHandle``."""
import weakref
from collections import OrderedDict

__all__ = ["RemovableHandle"]


class RemovableHandle:
    """Removes a hook from the dict(s) it was stored in; also a context manager.

    >>> from collections import OrderedDict
    >>> hooks = OrderedDict()
    >>> h = RemovableHandle(hooks); hooks[h.id] = print
    >>> with h: pass
    >>> len(hooks)
    0
    """

    next_id = 0

    def __init__(self, hooks_dict, *, extra_dict=None):
        # Weak references: a handle must not keep a module or a graph node alive.
        self.hooks_dict_ref = weakref.ref(hooks_dict)
        self.id = RemovableHandle.next_id
        RemovableHandle.next_id += 1
        if extra_dict is None:
            extra_dict = ()
        elif isinstance(extra_dict, dict):
            extra_dict = (extra_dict,)
        self.extra_dict_ref = tuple(weakref.ref(d) for d in extra_dict)

    def remove(self):
        hooks_dict = self.hooks_dict_ref()
        if hooks_dict is not None and self.id in hooks_dict:
            del hooks_dict[self.id]
        for ref in self.extra_dict_ref:
            d = ref()
            if d is not None and self.id in d:
                del d[self.id]

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.remove()


def new_hook_dict():
    return OrderedDict()

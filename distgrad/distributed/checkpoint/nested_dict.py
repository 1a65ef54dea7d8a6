"""Nested state dicts flattened to dotted keys and back (``a.b.0.c``), as PyTorch's DCP
flattens them: mappings are walked to their leaves, a list only when it holds a tensor
or a container that does; every other value (numbers, strings, tuples, lists of
numbers) is one leaf."""
from collections.abc import Mapping

from distgrad.autograd.tensor import Tensor

__all__ = ["traverse_state_dict", "flatten_state_dict", "unflatten_state_dict", "set_element",
           "get_element"]


def _is_leaf(value):
    if isinstance(value, Mapping):
        return False
    if not isinstance(value, list):
        return True
    return not any(isinstance(v, Tensor) or (isinstance(v, (Mapping, list)) and not _is_leaf(v))
                   for v in value)


def traverse_state_dict(state_dict, visitor):
    """Call ``visitor(path, value)`` for each leaf; ``path`` is a tuple of str and int."""
    stack = [((str(k),), v) for k, v in reversed(list(state_dict.items()))]
    while stack:  # iterative: a state dict may nest deeply
        path, value = stack.pop()
        if isinstance(value, Mapping):
            stack.extend((path + (str(k),), v) for k, v in reversed(list(value.items())))
        elif _is_leaf(value):
            visitor(path, value)
        else:
            stack.extend((path + (i,), v) for i, v in reversed(list(enumerate(value))))


def flatten_state_dict(state_dict):
    """``(flat, mappings)``: ``flat`` maps dotted keys to leaves, ``mappings`` each dotted
    key to its path."""
    flat, mappings = {}, {}

    def visit(path, value):
        key = ".".join(map(str, path))
        if key in flat:
            raise ValueError(f"duplicated flatten key {key}")
        flat[key] = value
        mappings[key] = path
    traverse_state_dict(state_dict, visit)
    return flat, mappings


def unflatten_state_dict(state_dict, mapping):
    nested = {}
    for key, value in state_dict.items():
        set_element(nested, mapping[key], value)
    return nested


def set_element(root, path, value):
    """Set ``value`` at ``path`` in ``root``, making dicts (str keys) and lists (int keys)
    on the way."""
    container = root
    for here, nxt in zip(path[:-1], path[1:]):
        fresh = {} if type(nxt) is str else []
        if isinstance(container, Mapping):
            container = container.setdefault(here, fresh)
        else:
            while len(container) <= here:
                container.append(None)
            if container[here] is None:
                container[here] = fresh
            container = container[here]
    last = path[-1]
    if type(last) is int:
        while len(container) <= last:
            container.append(None)
    container[last] = value


def get_element(root, path, default_value=None):
    value = root
    for part in path:
        if type(part) is int:
            if not isinstance(value, list) or len(value) <= part:
                return default_value
        elif not isinstance(value, Mapping) or part not in value:
            return default_value
        value = value[part]
    return value

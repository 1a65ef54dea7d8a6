"""Whole ``nn.Module`` s through the value codec: over RPC and in ``distgrad.save``/``load``.

A module travels as its class *reference* (``"module:qualname"``) plus its state:
training mode, parameters, buffers (and which are not persistent), submodules,
and the other attributes of its ``__dict__``. Nothing is pickled and rebuilding
runs no code of the module's class: the object is made with ``object.__new__``
and its ``__dict__`` filled in, without ``__init__``, ``__setstate__`` or
``__setattr__``. The class reference resolves through the receiver's rule of
trust, the decoding context's ``resolve(ref)`` (RPC: the worker's allowlist;
``distgrad.load``: ``distgrad.*`` and the modules the caller allows), and must
name an ``nn.Module`` subclass.

One tree travels as one table: a parameter shared by two layers (tied weights)
or a submodule reachable twice comes back shared, once. Tensors and modules
inside list, tuple and dict attributes are part of that table too. Functions and
classes held by attributes (an activation function, a block class) travel by
reference and resolve by the same rule as the module's class.

Hooks registered on a module (forward, backward, state_dict hooks) do not
travel: the rebuilt module has none. An attribute the codec cannot carry (a
lock, a lambda, an open file) raises ``TypeError`` naming its path, e.g.
``model.encoder._hook``. Parameters come back as writable ``Parameter`` s (a
received model can be trained), with their ``requires_grad``; ``.grad`` does
not travel.

>>> import distgrad
>>> from distgrad import codec
>>> class Trusting:  # a decoding context that trusts distgrad's own classes
...     def resolve(self, ref):
...         from distgrad.references import lookup
...         import importlib
...         return lookup(ref, importlib.import_module(ref.partition(":")[0]))
>>> net = distgrad.nn.Sequential(distgrad.nn.Linear(2, 3), distgrad.nn.Tanh())
>>> copy = codec.loads(codec.dumps(net), Trusting())
>>> type(copy[0]).__name__, copy[0].weight.shape, copy[0].weight is net[0].weight
('Linear', distgrad.Size([3, 2]), False)
"""
import inspect
from collections import OrderedDict

from ... import codec
from ..._tensor import Tensor
from ...references import reference_of
from ..parameter import Parameter
from .module import Module, empty_module_state
from ...autograd._internal import array_of, set_array

__all__ = ["MODULE_CODE"]

#: The value codec's extension code for an ``nn.Module`` tree.
MODULE_CODE = 14

_MACHINERY = frozenset(empty_module_state())

# How a value inside an attribute is carried: [tag, data].
_PLAIN, _PACKED, _TENSOR, _MODULE, _LIST, _TUPLE, _DICT, _ORDERED_DICT, _REF = range(9)
_INT64 = (-(1 << 63), (1 << 63) - 1)


class _TreeEncoder:
    """Walks one module tree into ``[modules, tensors]``; each module is
    ``[class ref, training, {param: tensor index}, {buffer: index}, [non-persistent],
    {child: module index}, {attribute: tagged value}]``, each tensor ``[tensor, is_param]``."""

    def __init__(self, enc):
        self.enc = enc
        self.modules, self.module_index = [], {}
        self.tensors, self.tensor_index = [], {}

    def tensor(self, t):
        i = self.tensor_index.get(id(t))
        if i is None:
            i = self.tensor_index[id(t)] = len(self.tensors)
            self.tensors.append([t, isinstance(t, Parameter)])
        return i

    def module(self, m, path):
        i = self.module_index.get(id(m))
        if i is not None:
            return i
        i = self.module_index[id(m)] = len(self.modules)
        self.modules.append(None)
        try:
            cls_ref = reference_of(type(m))
        except TypeError as e:
            raise TypeError(f"{path} cannot be sent or saved: its class: {e}") from None
        d = m.__dict__
        params = {k: None if p is None else self.tensor(p) for k, p in d["_parameters"].items()}
        buffers = {k: None if b is None else self.tensor(b) for k, b in d["_buffers"].items()}
        children = {k: None if c is None else self.module(c, f"{path}.{k}")
                    for k, c in d["_modules"].items()}
        attrs = {k: self.value(v, f"{path}.{k}", 0) for k, v in d.items()
                 if k not in _MACHINERY}
        self.modules[i] = [cls_ref, bool(d.get("training", True)), params, buffers,
                           sorted(d["_non_persistent_buffers_set"]), children, attrs]
        return i

    def value(self, v, path, depth):
        if depth > codec.MAX_DEPTH:
            raise codec.CodecError(f"{path} nests containers more than {codec.MAX_DEPTH} deep")
        t = type(v)
        if v is None or t in (bool, float, str) or (t is int and _INT64[0] <= v <= _INT64[1]):
            return [_PLAIN, v]
        if isinstance(v, Tensor):
            return [_TENSOR, self.tensor(v)]
        if isinstance(v, Module):
            return [_MODULE, self.module(v, path)]
        if t is list or t is tuple:
            return [_LIST if t is list else _TUPLE,
                    [self.value(x, f"{path}[{i}]", depth + 1) for i, x in enumerate(v)]]
        if t is dict or t is OrderedDict:
            return [_DICT if t is dict else _ORDERED_DICT,
                    [[self.packed(k, f"{path} (a key)"), self.value(x, f"{path}[{k!r}]", depth + 1)]
                     for k, x in v.items()]]
        if inspect.isfunction(v) or inspect.isclass(v) or inspect.isbuiltin(v):
            try:
                return [_REF, reference_of(v)]
            except TypeError as e:
                raise TypeError(f"{path} cannot be sent or saved: {e}") from None
        return [_PACKED, self.packed(v, path)]

    def packed(self, v, path):
        try:
            return self.enc.pack(v)
        except TypeError as e:
            raise TypeError(f"{path} cannot be sent or saved: {e}") from None


def _encode(root, enc):
    tree = _TreeEncoder(enc)
    tree.module(root, "model")
    return [tree.modules, tree.tensors]


class _TreeDecoder:
    def __init__(self, dec, tensors):
        self.dec = dec
        self.tensors = tensors
        self.modules = []

    def value(self, tagged, depth):
        if depth > codec.MAX_DEPTH or type(tagged) is not list or len(tagged) != 2:
            raise codec.CodecError("malformed module attribute")
        tag, data = tagged
        if tag == _PLAIN:
            if data is not None and type(data) not in (bool, int, float, str):
                raise codec.CodecError("malformed module attribute")
            return data
        if tag == _PACKED:
            return self.dec.unpack(data)
        if tag == _TENSOR:
            return _entry(self.tensors, data, Tensor)
        if tag == _MODULE:
            return _entry(self.modules, data, Module)
        if tag in (_LIST, _TUPLE):
            items = [self.value(x, depth + 1) for x in data]
            return items if tag == _LIST else tuple(items)
        if tag in (_DICT, _ORDERED_DICT):
            items = ((self.dec.unpack(k), self.value(x, depth + 1)) for k, x in data)
            return dict(items) if tag == _DICT else OrderedDict(items)
        if tag == _REF:
            return self.dec.resolve(data)
        raise codec.CodecError(f"unknown module attribute tag {tag!r}")


def _tensor(entry):
    t, is_param = entry
    if not isinstance(t, Tensor) or type(is_param) is not bool:
        raise codec.CodecError("malformed module tensor")
    if not array_of(t).flags.writeable:  # a view of the message or the file: give it its own bytes
        set_array(t, array_of(t).copy())
    return Parameter(t, requires_grad=t.requires_grad) if is_param else t


def _decode(payload, dec):
    if type(payload) is not list or len(payload) != 2 or type(payload[0]) is not list \
            or not payload[0] or type(payload[1]) is not list:
        raise codec.CodecError("malformed module")
    records, tensors = payload
    tree = _TreeDecoder(dec, [_tensor(e) for e in tensors])
    for record in records:  # every object first, so that references between them resolve
        if type(record) is not list or len(record) != 7:
            raise codec.CodecError("malformed module record")
        cls = dec.resolve(record[0])
        if not (isinstance(cls, type) and issubclass(cls, Module)):
            raise codec.CodecError(f"{record[0]!r} is not an nn.Module class")
        tree.modules.append(object.__new__(cls))
    for m, (_, training, params, buffers, non_persistent, children, attrs) in \
            zip(tree.modules, records):
        state = empty_module_state()
        if type(training) is not bool or not all(type(x) is dict for x in
                                                 (params, buffers, children, attrs)):
            raise codec.CodecError("malformed module record")
        state["training"] = training
        state["_parameters"].update((_name(k), _entry(tree.tensors, i, Parameter))
                                    for k, i in params.items())
        state["_buffers"].update((_name(k), _entry(tree.tensors, i, Tensor))
                                 for k, i in buffers.items())
        state["_non_persistent_buffers_set"].update(_name(k) for k in non_persistent)
        state["_modules"].update((_name(k), _entry(tree.modules, i, Module))
                                 for k, i in children.items())
        for k, v in attrs.items():
            if _name(k) in _MACHINERY:
                raise codec.CodecError(f"module attribute {k!r} is not data")
            state[k] = tree.value(v, 0)
        m.__dict__.update(state)
    return tree.modules[0]


def _name(k):
    if type(k) is not str or not k or k.startswith("__"):
        raise codec.CodecError(f"malformed module member name {k!r}")
    return k


def _entry(table, i, kind):
    """``table[i]``, checked; None stays None (a parameter or child set to None)."""
    if i is None:
        return None
    if type(i) is not int or not 0 <= i < len(table) or not isinstance(table[i], kind):
        raise codec.CodecError("malformed module member reference")
    return table[i]


codec.register(Module, MODULE_CODE, _encode, _decode)

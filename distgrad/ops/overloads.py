"""``distgrad.ops.aten``: names for the ops distgrad records, as ``torch.ops.aten``.

Code that picks ops by identity (a selective-checkpointing policy:
``op in [torch.ops.aten.mm.default]``) names them ``aten.<op>.<overload>``. In
distgrad an op is what joins the graph as one node, so each node class has one
:class:`OpOverload`, named as PyTorch's derivatives name the ATen op behind that node
(``MmBackward0`` is ``aten.mm.default``, ``MulBackward0`` is ``aten.mul.Tensor``).
distgrad's ops are coarser than ATen's in places: ``nn.Linear`` is one op,
``aten.linear.default`` (PyTorch dispatches ``aten.addmm`` or ``aten.mm`` under it),
and ``Tensor.matmul`` of other than 2-D, 3-D or 1-D operands is
``aten.matmul.default``.

>>> from distgrad.ops import aten
>>> aten.mm.default
<OpOverload(op='aten.mm', overload='default')>
>>> aten.mm.default.name(), aten.add.Tensor.name()
('aten::mm', 'aten::add.Tensor')
"""
import re

from ..autograd._internal import OpNode

__all__ = ["OpOverload", "OpOverloadPacket", "aten", "prim", "op_of", "is_recorded"]

# Node classes whose ATen op is not their name in snake case, or has a named overload
# (PyTorch numbers the nodes of one op's overloads: AddBackward0 is add.Tensor).
_BY_NODE = {
    "AddBackward0": ("add", "Tensor"), "AddBackward1": ("add", "Scalar"),
    "SubBackward0": ("sub", "Tensor"), "SubBackward1": ("sub", "Scalar"),
    "RsubBackward0": ("rsub", "Tensor"), "RsubBackward1": ("rsub", "Scalar"),
    "MulBackward0": ("mul", "Tensor"), "MulBackward1": ("mul", "Scalar"),
    "DivBackward0": ("div", "Tensor"), "DivBackward1": ("div", "Scalar"),
    "DivBackward2": ("div", "Tensor_mode"), "DivBackward3": ("div", "Scalar_mode"),
    "PowBackward0": ("pow", "Tensor_Scalar"), "PowBackward1": ("pow", "Tensor_Tensor"),
    "PowBackward2": ("pow", "Scalar"),
    "SumBackward1": ("sum", "dim_IntList"), "MeanBackward1": ("mean", "dim"),
    "MaxBackward0": ("max", "dim"), "MinBackward0": ("min", "dim"),
    "ClampBackward0": ("clamp", "Tensor"), "SqueezeBackward1": ("squeeze", "dim"),
    "VarBackward0": ("var", "correction"), "StdBackward0": ("std", "correction"),
    "TransposeBackward0": ("transpose", "int"), "SelectBackward0": ("select", "int"),
    "SliceBackward0": ("slice", "Tensor"), "SplitBackward0": ("split", "Tensor"),
    "UnbindBackward0": ("unbind", "int"), "IndexBackward0": ("index", "Tensor"),
    "ScatterBackward0": ("scatter", "src"), "ScatterBackward1": ("scatter", "value"),
    "MaskedFillBackward0": ("masked_fill", "Scalar"), "WhereBackward0": ("where", "self"),
    "FillBackward0": ("fill", "Scalar"), "FillBackward1": ("fill", "Tensor"),
    "SoftmaxBackward0": ("_softmax", "default"),
    "LogSoftmaxBackward0": ("_log_softmax", "default"),
    "NllLossBackward0": ("nll_loss_forward", "default"),
    "UnsafeViewBackward0": ("_unsafe_view", "default"),
    "ToCopyBackward0": ("_to_copy", "default"),
    "CopyBackwards": ("copy_", "default"),
    "ScaledDotProductFlashAttentionForCpuBackward0":
        ("_scaled_dot_product_flash_attention_for_cpu", "default"),
}
# ATen ops that selective-checkpointing policies name but distgrad records under another
# name or not at all: accepted (a policy naming them still loads), never recorded.
_NOT_RECORDED = {"aten": {"detach", "addmm", "_scaled_dot_product_efficient_attention",
                          "_scaled_dot_product_flash_attention",
                          "_scaled_dot_product_cudnn_attention"},
                 "prim": {"device"}}
_SUFFIX = re.compile(r"Backwards?\d*(_copy)?$")


def _snake(camel):
    camel = re.sub(r"(\d)([A-Z])", lambda m: m.group(1) + m.group(2).lower(), camel)
    return re.sub(r"(?<=[a-z0-9])([A-Z])", r"_\1", camel).lower()


def _aten_name(node_name):
    if node_name in _BY_NODE:
        return _BY_NODE[node_name]
    return _snake(_SUFFIX.sub("", node_name)), "default"


class OpOverload:
    """One overload of an op (``aten.mm.default``): compared by identity, one object per
    name, as PyTorch's."""

    __slots__ = ("overloadpacket", "_overloadname", "__weakref__")

    def __init__(self, packet, overload):
        self.overloadpacket = packet
        self._overloadname = overload

    def name(self):
        base = self.overloadpacket._qualified_op_name
        return base if self._overloadname == "default" else f"{base}.{self._overloadname}"

    def __repr__(self):
        return (f"<OpOverload(op='{self.overloadpacket._namespace}."
                f"{self.overloadpacket.__name__}', overload='{self._overloadname}')>")

    def __str__(self):
        return f"{self.overloadpacket._namespace}.{self.overloadpacket.__name__}." \
               f"{self._overloadname}"

    def __call__(self, *args, **kwargs):
        raise NotImplementedError(
            f"{self}: distgrad's op names identify recorded ops (for selective checkpointing "
            "policies); call the op itself (distgrad.<op> or the Tensor method) instead")


class OpOverloadPacket:
    """All overloads of one op name (``aten.mm``); ``.default`` and the named ones are
    attributes. A packet is not an op: policies name overloads."""

    def __init__(self, namespace, name):
        self._namespace = namespace
        self.__name__ = name
        self._qualified_op_name = f"{namespace}::{name}"

    def __getattr__(self, overload):
        if overload.startswith("__"):
            raise AttributeError(overload)
        if overload not in _overloads(self._namespace, self.__name__):
            raise AttributeError(f"The underlying op of '{self._namespace}.{self.__name__}' "
                                 f"has no overload name '{overload}'")
        op = OpOverload(self, overload)
        setattr(self, overload, op)  # one object per overload; later lookups skip this
        return op

    def overloads(self):
        return sorted(_overloads(self._namespace, self.__name__))

    def __repr__(self):
        return f"<OpOverloadPacket(op='{self._namespace}.{self.__name__}')>"

    def __str__(self):
        return f"{self._namespace}.{self.__name__}"


class _Namespace:
    """``aten`` / ``prim``: op packets by name, made on first use."""

    def __init__(self, name):
        self._name = name

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        if name not in _known()[self._name] and name not in _NOT_RECORDED[self._name]:
            raise AttributeError(f"'_OpNamespace' '{self._name}' object has no attribute "
                                 f"'{name}'")
        packet = OpOverloadPacket(self._name, name)
        setattr(self, name, packet)
        return packet

    def __repr__(self):
        return f"<distgrad op namespace '{self._name}'>"


aten = _Namespace("aten")
prim = _Namespace("prim")
_by_class = {}


_table = {"classes": -1}


def _known():
    """{namespace: {op name: {overloads}}} of every op node class defined so far (op
    tables of layers loaded later add theirs)."""
    classes, stack = [], [OpNode]
    while stack:
        for sub in stack.pop().__subclasses__():
            classes.append(sub)
            stack.append(sub)
    if len(classes) != _table["classes"]:
        known = {"aten": {}, "prim": {}}
        for cls in classes:
            name, overload = _aten_name(cls.__name__)
            known["aten"].setdefault(name, set()).add(overload)
        _table.update(classes=len(classes), known=known)
    return _table["known"]


def _overloads(namespace, name):
    return _known()[namespace].get(name) or {"default"}


def op_of(node_cls):
    """The :class:`OpOverload` of the op whose node class is ``node_cls``."""
    op = _by_class.get(node_cls)
    if op is None:
        name, overload = _aten_name(node_cls.__name__)
        op = _by_class[node_cls] = getattr(getattr(aten, name), overload)
    return op


def is_recorded(op):
    """Whether distgrad records ``op`` (an OpOverload) as a node of its own."""
    namespace = op.overloadpacket._namespace
    return op._overloadname in _known()[namespace].get(op.overloadpacket.__name__, ())

"""The model graph ``SummaryWriter.add_graph`` draws, from autograd's record of one forward
pass: each node of the backward graph is an op of the forward pass (named by the
innermost module whose forward produced it), each parameter a node feeding the op
that used it. PyTorch traces the forward pass instead (TorchScript); distgrad has no
tracer, so a forward pass that records nothing (no parameter or input needs a
gradient, or ``no_grad``) cannot be drawn, and ``add_graph`` says so."""
from tensorboard.compat.proto.attr_value_pb2 import AttrValue
from tensorboard.compat.proto.graph_pb2 import GraphDef
from tensorboard.compat.proto.node_def_pb2 import NodeDef
from tensorboard.compat.proto.tensor_shape_pb2 import TensorShapeProto
from tensorboard.compat.proto.versions_pb2 import VersionDef

from distgrad.autograd.grad_mode import enable_grad
from distgrad.autograd.tensor import Tensor

__all__ = ["graph"]


def _outputs(value):
    if isinstance(value, Tensor):
        return [value]
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in _outputs(v)]
    if isinstance(value, dict):
        return [t for v in value.values() for t in _outputs(v)]
    return []


def _shape_attr(shape):
    return AttrValue(shape=TensorShapeProto(dim=[TensorShapeProto.Dim(size=int(s))
                                                 for s in shape]))


def graph(model, args):
    """A ``GraphDef`` of ``model(*args)``."""
    scope_of = {}  # id(grad_fn) -> the innermost module that made it
    root = type(model).__name__
    names = {id(m): "/".join([root] + (n.split(".") if n else []))
             for n, m in model.named_modules()}
    handles = []

    def hook(module, inputs, output):
        for t in _outputs(output):
            if t.grad_fn is not None:
                scope_of.setdefault(id(t.grad_fn), names[id(module)])
    for m in model.modules():
        handles.append(m.register_forward_hook(hook))
    try:
        with enable_grad():
            outputs = _outputs(model(*args))
    finally:
        for h in handles:
            h.remove()
    roots = [t.grad_fn for t in outputs if t.grad_fn is not None]
    if not roots:
        raise RuntimeError(
            "add_graph: distgrad draws a model's graph from autograd's record of its forward "
            "pass, and this forward pass recorded none (no parameter or input needs a "
            "gradient, or it ran under no_grad); give the model parameters that require "
            "gradients, or skip add_graph")
    params = {id(p): n for n, p in model.named_parameters()}
    nodes, node_names, order = [], {}, []
    stack, seen = list(roots), set()
    while stack:  # iterative: deep graphs must not hit the recursion limit
        fn = stack.pop()
        if id(fn) in seen:
            continue
        seen.add(id(fn))
        order.append(fn)
        stack.extend(f for f, _ in fn.next_functions if f is not None)
    for k, fn in enumerate(order):
        variable = getattr(fn, "variable", None)
        if variable is not None:
            name = "/".join([root] + params.get(id(variable), f"tensor_{k}").split("."))
            node_names[id(fn)] = name
            nodes.append(NodeDef(name=name, op="Parameter",
                                 attr={"_output_shapes": _shape_attr(variable.shape)}))
        else:
            scope = scope_of.get(id(fn), root)
            node_names[id(fn)] = f"{scope}/{fn.name().removesuffix('Backward0')}_{k}"
    for fn in order:
        if getattr(fn, "variable", None) is not None:
            continue
        inputs = [node_names[id(f)] for f, _ in fn.next_functions if f is not None]
        nodes.append(NodeDef(name=node_names[id(fn)], op=fn.name().removesuffix("Backward0"),
                             input=inputs[::-1]))
    return GraphDef(node=nodes, versions=VersionDef(producer=22))

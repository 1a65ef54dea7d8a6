"""What the pipelining modules share: their errors, tensor metadata, which rank holds which
stage, and the flattening of nested arguments (``torch.distributed.pipelining._utils``).

A stage's tensors follow one contract, set by the first micro-batch it sees: every later
tensor at the same place has the same dtype and the same number of dimensions. Sizes may
change from micro-batch to micro-batch and from step to step (an uneven last micro-batch,
a batch of another size), because every message carries its own shape; PyTorch's stages
receive into buffers sized once, so it cannot. Shapes a user declares (``input_args``,
``output_args``) are contracts of the full shape.
"""
from distgrad.autograd import Tensor

__all__ = ["PipeliningMetadataError", "PipeliningShapeError", "StageFailedError",
           "StageShapeFailedError", "TensorMeta",
           "generate_stage_to_rank_mapping", "generate_rank_to_stage_mapping", "PipeInfo",
           "check_metas", "flatten_args", "tree_flatten", "tree_unflatten", "tree_map"]


class PipeliningMetadataError(RuntimeError):
    """Metadata of tensors between stages disagree (PyTorch 2.13's name)."""


class PipeliningShapeError(PipeliningMetadataError):
    """A tensor's shape or dtype is not what the stage or its neighbour expects (the name
    of earlier PyTorch releases; ``except PipeliningMetadataError`` catches it too)."""


class StageFailedError(RuntimeError):
    """distgrad's own: a stage on another rank failed in this step, so this one cannot go
    on; the message names that stage and what it raised (PyTorch's ranks wait instead,
    until their process group's timeout)."""


class StageShapeFailedError(StageFailedError, PipeliningShapeError):
    """A :class:`StageFailedError` whose cause was a :class:`PipeliningShapeError`."""


class TensorMeta:
    """Shape, dtype and requires_grad of a tensor, as sent between ranks (plain data)."""

    __slots__ = ("shape", "dtype", "requires_grad")

    def __init__(self, shape, dtype, requires_grad=False):
        self.shape, self.dtype, self.requires_grad = tuple(shape), str(dtype), requires_grad

    @classmethod
    def of(cls, t):
        return None if t is None else cls(t.shape, t.dtype, bool(t.requires_grad))

    def to_data(self):
        return [list(self.shape), self.dtype, self.requires_grad]

    @classmethod
    def from_data(cls, data):
        return None if data is None else cls(data[0], data[1], data[2])

    def __eq__(self, other):
        return isinstance(other, TensorMeta) and (self.shape, self.dtype) == (other.shape,
                                                                              other.dtype)

    def __repr__(self):
        return f"TensorMeta(shape={self.shape}, dtype={self.dtype})"

    def mismatch(self, got, exact):
        """Why ``got`` (a TensorMeta) breaks this contract, or None: the dtype and the
        number of dimensions always; every size when ``exact`` (a declared shape)."""
        if got.dtype != self.dtype:
            return f"dtype mismatch: expected {self.dtype}, got {got.dtype}"
        if (exact and got.shape != self.shape) or len(got.shape) != len(self.shape):
            kind = "shape" if exact else f"a {len(self.shape)}-dimensional tensor like"
            return f"shape mismatch: expected {kind} {self.shape}, got {got.shape}"
        return None


def check_metas(expected, got, exact, where):
    """Raise PipeliningShapeError when tensors ``got`` break contracts ``expected``
    (TensorMeta tuples); ``where`` names the place in the message."""
    if len(expected) != len(got):
        raise PipeliningShapeError(f"{where}: expected {len(expected)} tensors, got "
                                   f"{len(got)}")
    for i, (e, g) in enumerate(zip(expected, got)):
        if e is None or g is None:
            continue
        why = e.mismatch(g, exact)
        if why is not None:
            raise PipeliningShapeError(f"{where}, tensor {i}: {why}")


def generate_stage_to_rank_mapping(pp_size, num_stages, style="loop"):
    """Stage index -> rank: ``"loop"`` deals stages out in turn (rank = stage % pp_size),
    ``"v"`` goes down the ranks and back up (the V of ZBV and DualPipeV)."""
    if style == "loop":
        return {s: s % pp_size for s in range(num_stages)}
    if style != "v":
        raise ValueError(f"Style {style} is not supported.")
    if num_stages % pp_size:
        raise ValueError(f"num_stages {num_stages} must be evenly divisible by pp_size "
                         f"{pp_size} for V schedules")
    mapping = {}
    for s in range(num_stages):
        lap, pos = divmod(s, pp_size)
        mapping[s] = pos if lap % 2 == 0 else pp_size - 1 - pos
    return mapping


def generate_rank_to_stage_mapping(pp_size, num_stages, style="loop"):
    """Rank -> its stage indices, ascending."""
    out = {}
    for s, r in generate_stage_to_rank_mapping(pp_size, num_stages, style).items():
        out.setdefault(r, []).append(s)
    return out


class PipeInfo:
    """What :func:`build_stage` needs of a split model: its number of stages."""

    def __init__(self, graph=None, num_stages=1, has_loss_and_backward=False):
        self.graph, self.num_stages = graph, num_stages
        self.has_loss_and_backward = has_loss_and_backward


# -- nested arguments (tuples, lists, dicts of tensors and other values) -----------------

class _Spec:
    __slots__ = ("kind", "keys", "children")

    def __init__(self, kind, keys, children):
        self.kind, self.keys, self.children = kind, keys, children


_LEAF = _Spec(None, None, None)


def tree_flatten(tree):
    """``(leaves, spec)``: the leaves of nested tuples, lists and dicts, in order."""
    leaves = []

    def walk(node):
        if isinstance(node, (tuple, list)):
            return _Spec(type(node), None, [walk(c) for c in node])
        if isinstance(node, dict):
            keys = list(node)
            return _Spec(dict, keys, [walk(node[k]) for k in keys])
        leaves.append(node)
        return _LEAF
    spec = walk(tree)
    return leaves, spec


def tree_unflatten(leaves, spec):
    """The inverse of :func:`tree_flatten`."""
    it = iter(leaves)

    def build(s):
        if s.kind is None:
            return next(it)
        children = [build(c) for c in s.children]
        if s.kind is dict:
            return dict(zip(s.keys, children))
        if hasattr(s.kind, "_fields"):  # a namedtuple
            return s.kind(*children)
        return s.kind(children)
    return build(spec)


def tree_map(fn, tree):
    leaves, spec = tree_flatten(tree)
    return tree_unflatten([fn(x) for x in leaves], spec)


def flatten_args(args):
    """The tensors among nested ``args``, in order."""
    return [x for x in tree_flatten(args)[0] if isinstance(x, Tensor)]

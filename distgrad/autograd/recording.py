"""How a built-in op joins the graph: op nodes as tables, one Node class per op, its saved
tensors and one VJP per input.

In the spirit of HIPS/autograd's ``defvjp``: an op is declared with

    MulBackward0 = defop("MulBackward0", saved=("self", "other"),
                         vjps=(lambda xp, g, m, x, y: g * xp.conj(y),
                               lambda xp, g, m, x, y: g * xp.conj(x)))

A VJP takes ``(xp, g, meta, *saved)``. ``xp`` is a namespace of array functions:
NumPy's in an ordinary backward, and differentiable tensor ops under
``create_graph=True``, so one rule serves first and higher order. Both namespaces
live in ``distgrad.ops``, a layer above this one, which installs them with
:func:`install_backends` (the lower layer offers the slot; nothing here imports up).
Rules return gradients of the *output's* shape where broadcasting happened; the
engine reduces and casts them (see ``autograd/broadcast.py``). A VJP is only called
for inputs that need a gradient.
"""
from .grad_mode import _state
from .node import AccumulateGrad, Node, init_node, next_sequence_nr
from .op_observers import observe_record, observing
from .saved import KeptInput, SavedTensor, RELEASED_MESSAGE
from .tensor import TensorBase, _make

__all__ = ["OpNode", "defop", "record", "record_view", "record_multi", "new_node",
           "install_backends", "runs_only_builtin_code"]


class _Backends:
    """The array namespaces VJP rules run on, installed by ``distgrad.ops``."""
    array = None    # NumPy functions: an ordinary backward
    tensor = None   # differentiable tensor ops: backward under create_graph=True


_backends = _Backends()


def runs_only_builtin_code(node):
    """Whether running ``node`` in a backward runs distgrad's own code only: a built-in op's
    rules or a leaf's accumulation, with no hook on the node or its tensors and no
    saved-tensor hooks (whose unpack may read a file or call another process). What else
    a node may run (a custom Function's backward, a hook) is the user's and may block."""
    if node._pre_hooks or node._post_hooks or node._tensor_pre_hooks \
            or node._retains_grad_hooks:
        return False
    if isinstance(node, OpNode):
        return not any(s._has_hooks for s in node._saved)
    if type(node) is AccumulateGrad:
        variable = node._variable
        return not (variable._hooks or variable._post_acc_hooks)
    return False


def install_backends(array_namespace, tensor_namespace):
    """Give op nodes the namespaces their VJP rules use (``distgrad.ops`` calls this once)."""
    _backends.array = array_namespace
    _backends.tensor = tensor_namespace


class OpNode(Node):
    """A built-in op's ``grad_fn``. Subclasses are made by :func:`defop`."""

    __slots__ = ("_saved", "_meta", "_released", "_kept")
    _saved_names = ()
    _vjps = ()
    _vjp_all = None
    _result_saved = False
    _pack_reversed = False

    def apply(self, grads):
        saved = self._saved
        if self._released and saved:
            raise RuntimeError(RELEASED_MESSAGE)
        if self._kept:
            for k in self._kept:
                k.check_version(self)
        if _state.grad_enabled:
            xp = _backends.tensor
            vals = self._unpack_saved(SavedTensor.unpack)
            grads = [g if (g is None or isinstance(g, TensorBase)) else _make(g) for g in grads]
        else:
            xp = _backends.array
            vals = []
            for s in saved:  # SavedTensor.data, inlined: this runs for every node
                if s._has_hooks or s._vc[0] != s._version:
                    # Hooks or a failed version check are observable: take the ordered path.
                    vals = self._unpack_saved(SavedTensor.data)
                    break
                t = s._tensor
                vals.append(s._data if t is None else t._data)
        meta = self._meta
        if self._vjp_all is not None:
            needs = tuple(nxt is not None for nxt, _ in self._next)
            return self._vjp_all(xp, grads, meta, needs, *vals)
        g = grads[0]
        # A plain loop: a comprehension costs a frame of its own on every node.
        out = []
        for vjp, edge in zip(self._vjps, self._next):
            out.append(vjp(xp, g, meta, *vals) if edge[0] is not None else None)
        return out

    def _unpack_saved(self, unpack):
        """``unpack(saved, self)`` for every saved value, called in the order they were packed
        (as PyTorch, whose unpack hooks run in pack order), returned in ``_saved_names`` order.
        """
        saved = self._saved
        if not self._pack_reversed:
            return [unpack(s, self) for s in saved]
        vals = [None] * len(saved)
        inputs = len(saved) - 1 if self._result_saved else len(saved)
        for i in range(inputs - 1, -1, -1):
            vals[i] = unpack(saved[i], self)
        if inputs < len(saved):
            vals[inputs] = unpack(saved[inputs], self)
        return vals

    def _release(self):
        self._released = True
        for s in self._saved:  # SavedTensor.release, inlined: it runs for every node
            s._released = True
            s._tensor = s._data = s._packed = s._unpack_hook = None

    def __getattr__(self, name):
        # grad_fn._saved_<name> / _raw_saved_<name>, PyTorch's introspection of saved values.
        if name.startswith("_raw_saved_"):
            key = name[len("_raw_saved_"):]
            idx = _saved_index(type(self), key)
            if idx is not None:
                return self._saved[idx]
        elif name.startswith("_saved_"):
            key = name[len("_saved_"):]
            idx = _saved_index(type(self), key)
            if idx is not None:
                return self._saved[idx].unpack(self)
            meta = object.__getattribute__(self, "_meta")
            if isinstance(meta, dict) and key in meta:
                value = meta[key]
                return tuple(value) if isinstance(value, list) else value
        raise AttributeError(f"'{type(self).__name__}' object has no attribute '{name}'")

    def __dir__(self):
        # The introspection attributes that resolve, as PyTorch lists them on its nodes.
        names = set(super().__dir__())
        for key in type(self)._saved_names:
            names.update((f"_saved_{key}", f"_raw_saved_{key}"))
        meta = self._meta
        if isinstance(meta, dict):
            names.update(f"_saved_{key}" for key in meta)
        return sorted(names)


def _saved_index(cls, key):
    try:
        return cls._saved_names.index(key)
    except ValueError:
        return None


def defop(name, saved=(), vjps=(), vjp_all=None, pack_reversed=False):
    """Make the Node class of an op. ``saved`` names may include ``"result"`` (the output).

    ``pack_reversed``: PyTorch saves this op's inputs last to first, so saved-tensor
    pack hooks see them in that order (``mul`` packs ``other`` before ``self``); the
    result, when saved, always comes last.
    """
    attrs = {"__slots__": (), "_saved_names": tuple(saved), "_vjps": tuple(vjps),
             "_result_saved": "result" in saved, "_pack_reversed": pack_reversed}
    if vjp_all is not None:
        attrs["_vjp_all"] = staticmethod(vjp_all)
    cls = type(name, (OpNode,), attrs)
    cls.__module__ = "distgrad.ops.nodes"
    return cls


_NO_EDGE = (None, 0)


def _edges(inputs):
    """The edges to the producers of ``inputs`` and whether any of them needs a gradient."""
    edges = []
    any_grad = False
    for x in inputs:
        if x is None or not x._requires_grad:
            edges.append(_NO_EDGE)
        elif x._grad_fn is not None:
            edges.append((x._grad_fn, x._output_nr))
            any_grad = True
        else:
            ref = x._grad_accumulator
            acc = ref() if ref is not None else None
            edges.append((acc, 0) if acc is not None and acc._out_meta[0][0] == x._data.shape
                         else x._grad_edge())
            any_grad = True
    return tuple(edges), any_grad


def new_node(cls, edges, meta, out_meta):
    node = object.__new__(cls)
    init_node(node, edges, next_sequence_nr(), out_meta)
    node._meta = meta
    node._released = False
    node._kept = ()
    return node


def record(cls, out, inputs, saved=(), meta=None, kept=()):
    """Wrap ``out`` (an ndarray) as the result of op ``cls`` applied to tensor ``inputs``.

    ``saved`` lists the tensors to keep, in the order of ``cls._saved_names``
    without the trailing ``"result"``, which is added here when declared.
    ``kept`` lists non-differentiable tensor arguments (a mask, an index) whose arrays
    ``meta`` holds: backward raises if one of them was modified in place meanwhile.
    """
    if observing[0]:  # an op observer somewhere (selective checkpointing, a debug log)
        result = observe_record(record, cls, out, (inputs, saved, meta, kept), inputs, meta)
        if result is not None:
            return result
    if not _state.grad_enabled:
        return _make(out)
    edges, any_grad = _edges(inputs)
    if not any_grad:
        return _make(out)
    node = new_node(cls, edges, meta, ((out.shape, out.dtype),))
    t = _make(out, node, 0, True)
    if saved or cls._result_saved:
        if cls._pack_reversed:
            kept = [SavedTensor(s, False) for s in reversed(saved)]
            kept.reverse()
        else:
            kept = [SavedTensor(s, False) for s in saved]
        if cls._result_saved:
            kept.append(SavedTensor(t, True))
        node._saved = kept
    else:
        node._saved = ()
    if kept:
        node._kept = tuple(KeptInput(k) for k in kept if isinstance(k, TensorBase))
    return t


def record_view(cls, out, base, meta, view_fn):
    """Like :func:`record` for an op whose output shares ``base``'s storage.

    The view shares the base's version counter (an in-place change through either
    is seen by both) and remembers how to recompute itself from the base, which
    in-place ops on views need to rebase the graph (see ``ops/inplace.py``).
    """
    if observing[0]:
        result = observe_record(record_view, cls, out, (base, meta, view_fn), (base,), meta)
        if result is not None:
            return result
    t = record(cls, out, (base,), (), meta)
    t._vc = base._vc
    root = base._base
    if root is None:
        t._base = base
        t._view_fn = view_fn
    else:
        t._base = root
        parent_fn = base._view_fn
        t._view_fn = (lambda x, _p=parent_fn, _f=view_fn: _f(_p(x))) if parent_fn is not None else None
    return t


def record_multi(cls, outs, inputs, saved=(), meta=None, views_of=None):
    """Several outputs from one node (split, chunk, unbind, custom functions)."""
    if observing[0]:
        result = observe_record(record_multi, cls, outs, (inputs, saved, meta, views_of),
                                inputs, meta)
        if result is not None:
            return result
    tensors = [_make(o) for o in outs]
    if views_of is not None:
        for t in tensors:
            t._vc = views_of._vc
    edges, any_grad = _edges(inputs)
    if not any_grad or not _state.grad_enabled:
        return tensors
    node = new_node(cls, edges, meta, tuple((o.shape, o.dtype) for o in outs))
    node._saved = tuple(SavedTensor(s, False) for s in saved)
    for i, t in enumerate(tensors):
        t._grad_fn = node
        t._output_nr = i
        t._requires_grad = True
    return tensors

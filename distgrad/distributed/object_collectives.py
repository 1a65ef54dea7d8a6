"""Collectives on Python objects (``all_gather_object``, ``broadcast_object_list``,
``send_object_list``, ...), with ``torch.distributed``'s signatures.

Objects travel through :mod:`distgrad.codec`, never pickle: tensors, arrays,
numbers, strings and containers. Each is encoded into bytes and moved by the same
programs as the tensor collectives.
"""
import numpy as np

from distgrad import codec

from . import algorithms as alg
from .collective_call import _fp, _group, _root, _run
from .point_to_point import _p2p

__all__ = ["all_gather_object", "broadcast_object_list", "gather_object", "scatter_object_list",
           "send_object_list", "recv_object_list"]


def _encode(obj):
    return np.frombuffer(codec.dumps(obj), dtype=np.uint8)


def _decode(a):
    return codec.loads(bytes(a))


def all_gather_object(object_list, obj, group=None):
    """``object_list[i]`` = ``obj`` of rank ``i``, on every rank."""
    g = _group(group, "all_gather_object")
    if g is None:
        return
    if not isinstance(object_list, list) or len(object_list) != g.size():
        raise ValueError(f"all_gather_object: object_list must be a list of {g.size()} "
                         "elements (one per rank)")
    got = [None] * g.size()
    _run(g, _fp("all_gather_object"), alg.all_to_all([_encode(obj)] * g.size(),
                                                     got.__setitem__))
    object_list[:] = [_decode(x) for x in got]


def broadcast_object_list(object_list, src=None, group=None, device=None, group_src=None):
    """The objects of ``object_list`` on rank ``src`` replace those of every rank (the
    lists have one length everywhere)."""
    g = _group(group, "broadcast_object_list")
    if g is None:
        return
    root = _root(g, src, group_src, "src", "broadcast_object_list")
    box = [_encode(list(object_list)) if g.rank() == root else None]
    _run(g, _fp("broadcast_object_list", src=root),
         alg.scatter([box[0]] * g.size() if g.rank() == root else None, root,
                     lambda x: box.__setitem__(0, x)))
    objs = _decode(box[0])
    if len(objs) != len(object_list):
        raise ValueError(f"broadcast_object_list: rank {root} sent {len(objs)} objects, this "
                         f"rank's object_list has {len(object_list)}")
    object_list[:] = objs


def gather_object(obj, object_gather_list=None, dst=None, group=None, group_dst=None):
    """``object_gather_list[i]`` on rank ``dst`` = ``obj`` of rank ``i``."""
    g = _group(group, "gather_object")
    if g is None:
        return
    root = _root(g, dst, group_dst, "dst", "gather_object")
    got = None
    if g.rank() == root:
        if not isinstance(object_gather_list, list) or len(object_gather_list) != g.size():
            raise ValueError(f"gather_object: object_gather_list must be a list of {g.size()} "
                             "elements on the destination rank")
        got = [None] * g.size()
    _run(g, _fp("gather_object", dst=root), alg.gather(_encode(obj), got, root))
    if got is not None:
        object_gather_list[:] = [_decode(x) for x in got]


def scatter_object_list(scatter_object_output_list, scatter_object_input_list=None, src=None,
                        group=None, group_src=None):
    """``scatter_object_output_list[0]`` on rank ``i`` = ``scatter_object_input_list[i]``
    of rank ``src``."""
    g = _group(group, "scatter_object_list")
    if g is None:
        return
    root = _root(g, src, group_src, "src", "scatter_object_list")
    if not isinstance(scatter_object_output_list, list) or not scatter_object_output_list:
        raise ValueError("Expected argument scatter_object_output_list to be a list of size at "
                         "least 1.")
    ins = None
    if g.rank() == root:
        if not isinstance(scatter_object_input_list, (list, tuple)) \
                or len(scatter_object_input_list) != g.size():
            raise ValueError(f"scatter_object_list: scatter_object_input_list must have "
                             f"{g.size()} objects on the source rank")
        ins = [_encode(o) for o in scatter_object_input_list]
    box = [None]
    _run(g, _fp("scatter_object_list", src=root),
         alg.scatter(ins, root, lambda x: box.__setitem__(0, x)))
    scatter_object_output_list[0] = _decode(box[0])


def send_object_list(object_list, dst=None, group=None, device=None, group_dst=None,
                     use_batch=False):
    """Send the objects of ``object_list`` to rank ``dst`` (``recv_object_list`` there)."""
    if not isinstance(object_list, list):
        raise TypeError("send_object_list: object_list must be a list")
    work = _p2p("send", None, dst, group, 0, group_dst, _encode(list(object_list)))
    if work is not None:
        work.wait()


def recv_object_list(object_list, src=None, group=None, device=None, group_src=None,
                     use_batch=False):
    """Fill ``object_list`` with the objects rank ``src`` sent; return the sender's rank."""
    if not isinstance(object_list, list):
        raise TypeError("recv_object_list: object_list must be a list")
    work = _p2p("recv", None, src, group, 0, group_src, None)
    if work is None:
        return -1
    work.wait()
    objs = _decode(work._result[0])
    if len(objs) != len(object_list):
        raise ValueError(f"recv_object_list: {len(objs)} objects arrived, object_list has "
                         f"{len(object_list)}")
    object_list[:] = objs
    return work.source_rank()

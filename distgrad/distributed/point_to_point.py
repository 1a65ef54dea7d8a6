"""Point-to-point sends and receives of tensors, with ``torch.distributed``'s
signatures: ``send``/``recv``, ``isend``/``irecv`` and ``batch_isend_irecv``.

These functions check their arguments and hand the message to the world's
communicator, whose ``p2p.py`` matches sends with receives on the receiving rank.
"""
from .collective_call import _Out, _flat, _group, _root, _tensor
from .process_group import _world
from .work import Work

__all__ = ["send", "recv", "isend", "irecv", "P2POp", "batch_isend_irecv", "isend_value",
           "irecv_value"]


def _peer(g, peer, group_peer, param, collective):
    r = _root(g, peer, group_peer, param, collective)
    if r == g.rank():
        kind = "destination" if param == "dst" else "source"
        raise ValueError(f"Invalid {kind} rank: {kind} rank should not be the same as the rank "
                         "of the current process.")
    return r


def _p2p(kind, tensor, peer, group, tag, group_peer, array, on_done=None):
    collective = "isend" if kind == "send" else "irecv"
    g = _group(group, collective)
    if g is None:
        return None
    if isinstance(tag, bool) or not isinstance(tag, int):
        raise TypeError(f"{collective}: tag must be an int, not {type(tag).__name__}")
    param = "dst" if kind == "send" else "src"
    if kind == "recv" and peer is None and group_peer is None:
        r = None
    else:
        r = _peer(g, peer, group_peer, param, collective)
    if g._state is None:
        raise RuntimeError(f"{collective}: the group has one rank; there is no peer")
    work = Work([tensor] if tensor is not None else [])
    state = g._state
    target = state.ranks[r] if r is not None else None
    return _world.comm.submit_p2p(state, kind, target, tag, array, work, on_done)


def isend(tensor, dst=None, group=None, tag=0, group_dst=None):
    """Send ``tensor`` to rank ``dst``; the returned Work completes once it is on its way."""
    _tensor(tensor, "tensor")
    return _p2p("send", tensor, dst, group, tag, group_dst, _flat(tensor))


def irecv(tensor, src=None, group=None, tag=0, group_src=None):
    """Receive into ``tensor`` from rank ``src`` (None: any rank; ``Work.source_rank``)."""
    _tensor(tensor, "tensor")
    out = _Out(tensor, "irecv")
    return _p2p("recv", tensor, src, group, tag, group_src, out.flat, out.done)


def isend_value(value, dst=None, group=None, tag=0, group_dst=None):
    """distgrad's own: send ``value`` (arrays, lists of them, numbers, strings, None: what
    the codec carries) to rank ``dst``; arrays keep their shapes and dtypes, so the receiver
    (:func:`irecv_value`) needs no buffer of the right size, as :func:`irecv` does.
    Pipelines send activations whose shapes change from step to step this way."""
    return _p2p("send", None, dst, group, tag, group_dst, value)


def irecv_value(src=None, group=None, tag=0, group_src=None):
    """distgrad's own: receive what :func:`isend_value` sent with ``tag``; the returned
    Work's ``result()[0]`` is the value (its arrays may be read-only views of the message)."""
    return _p2p("recv", None, src, group, tag, group_src, None)


def send(tensor, dst=None, group=None, tag=0, group_dst=None):
    work = isend(tensor, dst, group, tag, group_dst)
    if work is not None:
        work.wait()


def recv(tensor, src=None, group=None, tag=0, group_src=None):
    """Receive into ``tensor``; return the sender's global rank."""
    work = irecv(tensor, src, group, tag, group_src)
    if work is None:
        return -1
    work.wait()
    return work.source_rank()


class P2POp:
    """One send or recv of :func:`batch_isend_irecv` (``op`` is ``isend`` or ``irecv``)."""

    def __init__(self, op, tensor, peer=None, group=None, tag=0, group_peer=None):
        if op not in (isend, irecv, send, recv):
            raise ValueError("Invalid ``op``. Expected ``op`` to be of type ``torch.distributed."
                             "isend`` or ``torch.distributed.irecv``.")
        self.op = isend if op in (isend, send) else irecv
        self.tensor, self.peer, self.group, self.tag, self.group_peer = (tensor, peer, group,
                                                                         tag, group_peer)


def batch_isend_irecv(p2p_op_list):
    """Start every op of the list; return their Works."""
    if not p2p_op_list or not all(isinstance(p, P2POp) for p in p2p_op_list):
        raise ValueError("Invalid ``p2p_op_list``. Each op is expected to to be of type "
                         "``torch.distributed.P2POp``.")
    return [p.op(p.tensor, p.peer, p.group, p.tag, p.group_peer) for p in p2p_op_list]

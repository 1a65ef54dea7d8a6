"""Remote references: ``RRef`` objects, as ``torch.distributed.rpc.RRef``.

An RRef names a value held by its owner (see ``owner.py`` for the owner's table
and the fork-counting lifetime protocol). It travels as ``[owner, rref id,
fork id]``; sending one registers a new fork with the owner first.
"""
import types

from .. import codec
from .current import current_agent

__all__ = ["RRef"]

_NOVALUE = object()


class _Proxy:
    """``rref.rpc_sync().method(*args)``: calls a method of the referenced object."""

    def __init__(self, rref, mode, timeout):
        self._rref, self._mode, self._timeout = rref, mode, timeout

    def __getattr__(self, method):
        if method.startswith("__") and method.endswith("__"):
            raise AttributeError(method)
        rref, mode, timeout = self._rref, self._mode, self._timeout

        def call(*args, **kwargs):
            agent = rref._need_agent()
            payload = (rref._rid, method, args, kwargs)
            if mode == "remote":
                return agent.remote(rref._owner, "@rref.call", payload, None, timeout)
            if mode == "sync":
                return agent.call_sync(rref._owner, "@rref.call", payload, None, timeout)
            return agent.call(rref._owner, "@rref.call", payload, None, timeout)
        return call


class RRef:
    """A reference to a value owned by one worker (``torch.distributed.rpc.RRef``).

    ``RRef(value)`` makes an owner RRef in this process; ``rpc.remote`` returns
    RRefs to values created on other workers. ``RRef[Tensor]`` is a type annotation,
    as PyTorch's RRef is generic.
    """

    __class_getitem__ = classmethod(types.GenericAlias)

    def __init__(self, value=_NOVALUE, type_hint=None):
        self._agent_ref = None
        self._owner = None
        self._rid = self._fid = None
        self._created = None  # Future of the creating remote() call, if any
        self._value = value
        if value is _NOVALUE:
            return
        agent = current_agent()
        if agent is not None:
            agent.adopt_rref(self)

    @classmethod
    def _make(cls, agent, owner, rid, fid, created=None):
        r = cls.__new__(cls)
        r._value = _NOVALUE
        r._created = created
        r._bind(agent, owner, rid, fid)
        return r

    def _bind(self, agent, owner, rid, fid):
        # the agent's own weakref, not one of ours: an RRef that dies in a reference cycle
        # (say, held by the frame of a traceback) is collected with the weakrefs it owns,
        # and CPython clears those before __del__ runs; then the fork would never be released
        self._agent_ref = agent.weakref
        self._owner, self._rid, self._fid = owner, rid, fid
        agent.forks.alive.add(self)

    def _need_agent(self):
        agent = self._agent_ref() if self._agent_ref is not None else None
        if agent is None or not agent.running:
            raise RuntimeError("RRef used without a running RPC agent (call init_rpc first)")
        return agent

    def __del__(self):
        try:
            agent = self._agent_ref() if self._agent_ref is not None else None
            if agent is not None and self._fid is not None:
                agent.release_fork(self._owner, self._rid, self._fid)
        except Exception:  # interpreter shutdown: nothing left to notify
            pass

    def is_owner(self):
        agent = self._agent_ref() if self._agent_ref is not None else None
        return self._owner is None or (agent is not None and self._owner == agent.rank)

    def owner(self):
        return self._need_agent().worker_info(self._owner) if self._owner is not None else None

    def owner_name(self):
        o = self.owner()
        return o.name if o is not None else None

    def confirmed_by_owner(self):
        if self._created is None:
            return True
        return self._created.done() and self._created.exception() is None

    def local_value(self):
        if not self.is_owner():
            raise RuntimeError(f"local_value() called on a user RRef; its owner is "
                               f"{self.owner_name()!r} (use to_here())")
        if self._value is not _NOVALUE:
            return self._value
        agent = self._need_agent()
        return agent.owner.get(self._rid, agent.options.rpc_timeout or None)

    def to_here(self, timeout=-1):
        if self.is_owner():
            return self.local_value()
        agent = self._need_agent()
        return agent.call_sync(self._owner, "@rref.fetch", (self._rid,), None, timeout)

    def rpc_sync(self, timeout=-1):
        return _Proxy(self, "sync", timeout)

    def rpc_async(self, timeout=-1):
        return _Proxy(self, "async", timeout)

    def remote(self, timeout=-1):
        return _Proxy(self, "remote", timeout)

    def __repr__(self):
        kind = "OwnerRRef" if self.is_owner() else "UserRRef"
        return f"{kind}(owner={self._owner}, rref_id={self._rid}, fork_id={self._fid})"


def _encode_rref(rref, enc):
    ctx = enc.context
    if ctx is None or getattr(ctx, "encode_rref", None) is None:
        raise TypeError("RRef arguments need a running RPC agent")
    return ctx.encode_rref(rref)


def _decode_rref(payload, dec):
    ctx = dec.context
    if ctx is None or getattr(ctx, "decode_rref", None) is None:
        raise codec.CodecError("RRef received outside an RPC agent")
    return ctx.decode_rref(payload)


codec.register(RRef, 7, _encode_rref, _decode_rref)

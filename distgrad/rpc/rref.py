"""Remote references: ``RRef`` objects and the owner's table of referenced values.

Lifetime protocol (reference counting by fork):
every RRef object, on the owner or elsewhere, holds a *fork id* counted in the
owner's table entry for its RRef id. Creating an object adds one to its fork
(``remote()`` carries the fork in the request; an RRef sent as an argument gets a
new fork that the sender registers with the owner and the sender keeps its own
RRef alive until the owner acknowledged); deleting an object subtracts one. Counts
are per fork and may go negative transiently when messages cross, so ordering does
not matter; the owner frees the value once no fork has a non-zero count and the
value is ready.
"""
import threading
import weakref

from .. import codec
from .errors import RpcTimeoutError

__all__ = ["RRef", "OwnerTable"]

_NOVALUE = object()


class _Entry:
    __slots__ = ("value", "exc", "ready", "forks")

    def __init__(self):
        self.value = None
        self.exc = None
        self.ready = threading.Event()
        self.forks = {}


class OwnerTable:
    """Values this process owns on behalf of RRefs, with their fork counts."""

    def __init__(self):
        self._lock = threading.RLock()  # re-entrant: __del__ may run inside a locked section
        self._entries = {}

    def __len__(self):
        return len(self._entries)

    def _entry(self, rid):
        e = self._entries.get(rid)
        if e is None:
            e = self._entries[rid] = _Entry()
        return e

    def add_fork(self, rid, fid, delta):
        with self._lock:
            e = self._entry(rid)
            c = e.forks.get(fid, 0) + delta
            if c:
                e.forks[fid] = c
            else:
                e.forks.pop(fid, None)
            if not e.forks and e.ready.is_set():
                del self._entries[rid]

    def set_value(self, rid, value, exc=None):
        with self._lock:
            e = self._entry(rid)
            e.value, e.exc = value, exc
            e.ready.set()
            if not e.forks:
                del self._entries[rid]

    def get(self, rid, timeout=None):
        with self._lock:
            e = self._entry(rid)
        if not e.ready.wait(timeout):
            raise RpcTimeoutError(f"RRef {rid} value not ready within {timeout} s")
        if e.exc is not None:
            raise e.exc
        return e.value

    def clear(self):
        with self._lock:
            self._entries.clear()


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
    RRefs to values created on other workers.
    """

    def __init__(self, value=_NOVALUE, type_hint=None):
        self._agent_ref = None
        self._owner = None
        self._rid = self._fid = None
        self._created = None  # Future of the creating remote() call, if any
        self._value = value
        if value is _NOVALUE:
            return
        from .agent import current_agent
        agent = current_agent()
        if agent is not None:
            self._bind(agent, agent.rank, agent.new_id(), agent.new_id())
            agent.rrefs.add_fork(self._rid, self._fid, 1)
            agent.rrefs.set_value(self._rid, value)

    @classmethod
    def _make(cls, agent, owner, rid, fid, created=None):
        r = cls.__new__(cls)
        r._value = _NOVALUE
        r._created = created
        r._bind(agent, owner, rid, fid)
        return r

    def _bind(self, agent, owner, rid, fid):
        self._agent_ref = weakref.ref(agent)
        self._owner, self._rid, self._fid = owner, rid, fid

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
        return agent.rrefs.get(self._rid, agent.options.rpc_timeout or None)

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

"""The RRef fork protocol, both sides: how a process makes, sends, receives and drops the
forks of RRefs, and what an owner counts when its peers' notices about them arrive.

An RRef object holds a *fork id* counted in its owner's entry (``owner.py``). Sending an
RRef makes a new fork: on the owner it is counted at once; elsewhere an ``rref.add``
notice is posted to the owner (``bookkeeping.py``), in order with this process's later
notices, so the owner counts the new fork before it hears that the sender's own fork
was dropped (``rref.del``). No message and no wait of its own (``PROTOCOL.md``).
"""
import weakref

from .. import codec
from .rref import RRef

__all__ = ["Forks"]


class Forks:
    """The fork protocol of one process. Collaborators, given explicitly: ``home`` (the
    agent RRefs made here are bound to: their methods call through it), ``rank`` and
    ``world_size``, ``table`` (the :class:`~distgrad.rpc.owner.OwnerTable` of values
    owned here), ``new_id()`` (a fresh ``(rank, counter)``), ``post_notice(dst, kind,
    item)`` and ``running()`` (whether notices can still be sent)."""

    def __init__(self, home, rank, world_size, table, new_id, post_notice, running):
        self.home, self.rank, self.world_size = home, rank, world_size
        self.table, self.new_id = table, new_id
        self.post_notice, self.running = post_notice, running
        #: the RRef objects bound to this process's agent that are still alive (see
        #: :meth:`~distgrad.rpc.lifecycle.Lifecycle.shutdown`, which collects garbage
        #: only when one may be held by a reference cycle)
        self.alive = weakref.WeakSet()

    # ------------------------------------------------------------------ this process's RRefs
    def adopt(self, rref):
        """An ``RRef(value)`` made in this process becomes an owner RRef."""
        rref._bind(self.home, self.rank, self.new_id(), self.new_id())
        self.table.add_fork(rref._rid, rref._fid, 1)
        self.table.set_value(rref._rid, rref._value)

    def encode(self, rref, dst):
        """The wire form of ``rref`` sent to rank ``dst``: a new fork of it."""
        if rref._rid is None:  # RRef(value) made before init_rpc: adopt it now
            self.adopt(rref)
        fid = self.new_id()
        if rref._owner == self.rank:
            self.table.add_fork(rref._rid, fid, 1)
        else:
            # A notice, in order with this process's later ones: the owner counts the new
            # fork before it hears that our own fork (which we hold now) was dropped, so the
            # value outlives both; the receiver's own drop may come first (counts may go
            # negative for a while). No message and no wait of its own.
            self.post_notice(rref._owner, "rref.add", [list(rref._rid), list(fid)])
        return [rref._owner, list(rref._rid), list(fid)]

    def decode(self, meta):
        """An RRef received (its wire form checked): the fork its sender made for us."""
        if type(meta) is not list or len(meta) != 3:
            raise codec.CodecError("malformed RRef")
        owner, rid, fid = meta
        if type(owner) is not int or not 0 <= owner < self.world_size:
            raise codec.CodecError(f"RRef owner {owner!r} out of range")
        for x in (rid, fid):
            if type(x) is not list or len(x) != 2 or not all(type(i) is int for i in x):
                raise codec.CodecError(f"malformed RRef id {x!r}")
        return RRef._make(self.home, owner, tuple(rid), tuple(fid))

    def release(self, owner, rid, fid):
        """An RRef object died (any thread, maybe inside a lock): tell the owner, later."""
        if not self.running():
            return
        if owner == self.rank:
            self.table.add_fork(rid, fid, -1)
        else:
            self.post_notice(owner, "rref.del", [list(rid), list(fid)])

    # ------------------------------------------------------------------ the owner's side
    def on_made(self, src, items):
        """``rref.add`` notices of ``src``: forks it made (only a fork's creator may)."""
        for item in items:
            if type(item) is list and len(item) == 2:
                self.table.add_fork(item[0], item[1], 1, src)

    def on_dropped(self, src, items):
        """``rref.del`` notices of ``src``: forks it dropped."""
        for item in items:
            if type(item) is list and len(item) == 2:
                self.table.add_fork(item[0], item[1], -1, src)

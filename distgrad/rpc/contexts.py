"""The codec context of each message, and the shared-memory segments a message holds.

A message to or from a peer is encoded or decoded with a context that knows this
process's RRef forks (``forks.py``), resolves function references against the allowlist,
and lends or maps shared-memory segments (``shm.py``). Every segment a message names is
accounted for on every path: lent for a message that leaves, given back when it does not
(an encoding error, an interceptor that drops it), released when a received one was not
mapped (a malformed body, a late reply).
"""
from . import interceptors
from .shm import LendingContext

__all__ = ["MessageContexts"]


class _MessageContext(LendingContext):
    """The codec context of one message to or from ``peer``: RRef forks, function
    references resolved against the allowlist, and shared-memory segments (``segments``:
    lent for an outgoing message, named by the header of an incoming one)."""

    __slots__ = ("contexts", "peer", "segments", "mapped")
    functions_by_reference = True

    def __init__(self, contexts, peer, segments=()):
        self.contexts, self.peer = contexts, peer
        self.segments = list(segments)
        self.mapped = set()

    def encode_rref(self, rref):
        return self.contexts.forks.encode(rref, self.peer)

    def decode_rref(self, meta):
        return self.contexts.forks.decode(meta)

    def resolve(self, ref):
        return self.contexts.allowlist.resolve(ref)

    def _same_host(self):
        return self.contexts.same_host


class MessageContexts:
    """Makes the codec contexts of one process's messages and settles their segments.
    Collaborators: ``forks`` (:class:`~distgrad.rpc.forks.Forks`), ``allowlist``,
    ``same_host`` (:class:`~distgrad.rpc.shm.SameHost`) and ``members``
    (:class:`~distgrad.rpc.members.Members`, for the interceptors' view of a peer)."""

    def __init__(self, forks, allowlist, same_host, members):
        self.forks, self.allowlist = forks, allowlist
        self.same_host, self.members = same_host, members

    def encode(self, dst):
        """The context of a message to rank ``dst``."""
        return _MessageContext(self, dst)

    def decode(self, src, segments=()):
        """The context of a message from rank ``src`` whose header named ``segments``."""
        return _MessageContext(self, src, segments)

    def settle(self, src, segments, ctx):
        """After decoding a message from ``src``: release the segments it named but that
        were not mapped (the body was malformed, or the message is dropped)."""
        self.same_host.settle(src, segments, ctx.mapped if ctx is not None else ())

    def give_back(self, dst, ctx):
        """An outgoing message was not sent: its segments are free again."""
        self.same_host.give_back(dst, ctx.segments)
        ctx.segments = []

    def copies(self, dst, kind, what, ctx):
        """How many times to send an encoded message to rank ``dst``: interceptors may drop
        or duplicate it (``interceptors.copies``). One whose arrays ride in shared memory
        goes at most once; a dropped one gives its segments back."""
        n = interceptors.copies(self.members.workers[dst], kind, what)
        if n == 0:
            self.give_back(dst, ctx)
        return min(n, 1) if ctx.segments else n

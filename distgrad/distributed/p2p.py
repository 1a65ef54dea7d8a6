"""Point-to-point messages of a process-group world: ``send`` and ``recv``.

A send carries ``[P2P, group, tag]`` and leaves as soon as the communicator's I/O
thread takes it: nothing waits for the receiver. On the receiving rank messages
and recvs are matched in order per (source, tag), or from any source: a recv takes
the oldest message of its tag it accepts, a message the oldest recv of its tag that
accepts it. Whichever comes first waits for the other, a message counted against
its sender's backlog (``messages.Backlog``), a recv until its group's timeout (in
the communicator's deadlines). Point-to-point messages are outside the order of
collectives.

Everything here runs on the communicator's I/O thread, which owns this state; other
threads reach it only through ``Communicator.submit_p2p``.
"""
import collections

import numpy as np

from .errors import DistBackendError
from .messages import P2P

__all__ = ["P2PRequest", "PointToPoint"]


#: A send or recv handed to the I/O thread (see ``Communicator.submit_p2p``).
P2PRequest = collections.namedtuple(
    "P2PRequest", "kind group peer tag array work on_done deadline")


class Recv:
    """A recv of this rank: matched at once with a message that came before it, or
    waiting for one (in its tag's queue and in the communicator's deadlines).

    ``peer`` is the global rank it takes from (None: any member); ``out`` the flat
    array it fills (None: the work's result is whatever value comes). ``work`` is
    None once the recv is done, which makes its entry in the deadlines stale.
    """

    __slots__ = ("comm", "group", "peer", "out", "on_done", "work")

    def __init__(self, comm, group, peer, out, on_done, work):
        self.comm, self.group, self.peer = comm, group, peer
        self.out, self.on_done, self.work = out, on_done, work

    def accepts(self, src):
        return self.peer is None or self.peer == src

    def deliver(self, src, payload):
        work, self.work = self.work, None
        exc = None
        work._source = src
        out = self.out
        if out is None:
            work._result = [payload]
        elif type(payload) is not np.ndarray or payload.size != out.size \
                or payload.dtype != out.dtype:
            got = (f"{payload.size} elements of {payload.dtype}" if type(payload) is np.ndarray
                   else f"a {type(payload).__name__}")
            exc = DistBackendError(f"recv: rank {src} sent {got}, but the tensor passed to "
                                   f"recv here holds {out.size} elements of {out.dtype}")
        else:
            out[...] = payload.reshape(-1)
            if self.on_done is not None:
                self.on_done()
        work._finish(exc, self.comm.callbacks)

    def fail(self, err):
        work, self.work = self.work, None
        work._finish(err, self.comm.callbacks)

    # as an entry of the communicator's deadlines
    def done(self):
        return self.work is None

    def expire(self):
        self.comm.break_group(self.group, DistBackendError(
            f"recv from {'any rank' if self.peer is None else f'rank {self.peer}'} "
            f"timed out after {self.group.timeout:g} s in {self.group.describe()}"), tell=True)


class PointToPoint:
    """The sends and recvs of every group of one communicator, and the messages and
    recvs that wait for each other.

    It is handed its communicator (``comm.py`` imports this module, not the other way
    round) and uses it as the program runner does: to send, for the backlog, the
    deadlines and breaking groups.
    """

    def __init__(self, comm):
        self.comm = comm
        self._messages = collections.defaultdict(collections.deque)  # (gid, tag) -> (src, payload)
        self._recvs = collections.defaultdict(collections.deque)     # (gid, tag) -> Recv

    def start(self, request):
        """Send now, or receive: from a message here already, else post the recv."""
        group, peer, tag = request.group, request.peer, request.tag
        if request.kind == "send":
            if group.broken is not None or peer in group.gone:
                request.work._finish(group.broken or group.gone[peer], self.comm.callbacks)
                return
            self.comm.send_message(peer, [P2P, group.gid, tag, 0, None], request.array)
            request.work._finish(None, self.comm.callbacks)
            return
        recv = Recv(self.comm, group, peer, request.array, request.on_done, request.work)
        messages = self._messages.get((group.gid, tag))
        if messages:  # received before (also from a peer that has left since)
            for i, (src, payload) in enumerate(messages):
                if recv.accepts(src):
                    del messages[i]
                    self.comm.backlog.taken(src)
                    recv.deliver(src, payload)
                    return
        why = group.broken or _unreachable(group, peer)
        if why is not None:
            recv.fail(why)
            return
        self._recvs[(group.gid, tag)].append(recv)
        self.comm.deadlines.add(request.deadline, recv)

    def on_message(self, group, src, tag, payload):
        """A P2P message: to the oldest recv that accepts it, or into its tag's queue."""
        recvs = self._recvs.get((group.gid, tag))
        if recvs:
            for i, recv in enumerate(recvs):
                if recv.accepts(src):
                    del recvs[i]
                    recv.deliver(src, payload)
                    return
        if not self.comm.backlog.keep(src):
            self.comm.break_group(group, DistBackendError(
                f"rank {src} sent more than {self.comm.backlog.limit} messages nobody received"),
                tell=True)
            return
        self._messages[(group.gid, tag)].append((src, payload))

    # ------------------------------------------------------------------ failures
    def fail_recvs_from(self, group, rank, err):
        """Posted recvs that only ``rank`` (gone) could have satisfied fail."""
        for key in self._keys(self._recvs, group):
            queue = self._recvs[key]
            for recv in list(queue):
                if _unreachable(group, recv.peer) is not None:
                    queue.remove(recv)
                    recv.fail(err)

    def fail_group(self, group, err, keep_received):
        """``group`` is broken: its posted recvs fail with ``err``. The messages it
        received go too, unless ``keep_received`` (a member left cleanly: what it sent
        before leaving can still be received)."""
        for key in self._keys(self._recvs, group):
            for recv in self._recvs.pop(key):
                recv.fail(err)
        if keep_received:
            return
        for key in self._keys(self._messages, group):
            for src, _ in self._messages.pop(key):
                self.comm.backlog.taken(src)

    @staticmethod
    def _keys(queues, group):
        return [k for k in queues if k[0] == group.gid]


def _unreachable(group, peer):
    """Why a recv from ``peer`` (None: any member) can get nothing more, or None."""
    if peer is not None:
        return group.gone.get(peer)
    others = [r for r in group.ranks if r != group.ranks[group.rank]]
    if others and all(r in group.gone for r in others):
        return group.gone[others[0]]
    return None

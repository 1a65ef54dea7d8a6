"""Bookkeeping that rides along: small notices for a peer travel with the next message.

A notice is something a peer must learn but nobody waits for: an autograd context
was released, an RRef fork was dropped. Sending each as a message of its own costs a
message, a wake-up and a handler on the peer, on the critical path of whatever the
peer does next. Instead notices wait here, per peer, and leave in the header of the
next message to that peer (a CALL or a REPLY, under the extra ``"@bk"``); what is still
here ``delay`` seconds (100 ms: most steps of a training loop send something to every
peer within that) after it was posted leaves as one SYSTEM message (``@bk``) that the
I/O thread sends. A receiver hands each kind of notice to its registered handler.

Notices from one sender are handled in the order they were posted (whatever their
kinds): RRef forks rely on it (a fork's registration, posted before the sender drops
its own fork, must be counted first).

A notice posted with ``ack=(timeout, on_timeout)`` is acknowledged by its receiver
(the acknowledgement rides back the same way); one not acknowledged within
``timeout`` seconds calls ``on_timeout(peer, kind, item)`` once (to log it: the peer
is stalled or gone). Items must be msgpack values; acknowledged ones also hashable.

A header's box is ``[[kind, [item, ...]], ...]`` (runs of one kind, in posting order);
peers can send anything, so a box is checked (kinds are strings, at most
:data:`MAX_ITEMS` items) and unknown kinds are dropped.
"""
import logging
import threading
import time

__all__ = ["Bookkeeping", "EXTRA", "MAX_ITEMS"]

log = logging.getLogger("distgrad.rpc")

EXTRA = "@bk"       # the header extra the box travels under
MAX_ITEMS = 65536   # notices one message may carry
_ACK = "@ack"       # the kind of acknowledgements: items are [kind, item]
_FOREVER = float("inf")


class Bookkeeping:
    """Notices waiting for a ride, per peer; the handlers of notices that arrive."""

    def __init__(self, world_size, delay=0.1):
        self.delay = delay
        self._lock = threading.Lock()
        self._boxes = [None] * world_size      # peer -> [[kind, [items]], ...] waiting
        self._posted = {}                      # peer -> when its oldest waiting notice came
        self._unacked = {}                     # (peer, kind, item) -> (deadline, on_timeout)
        self._handlers = {}                    # kind -> (fn(src, items), acknowledge)
        self.next_due = _FOREVER               # earliest flush or acknowledgement deadline

    def register(self, kind, fn, acknowledge=False):
        """Call ``fn(src, items)`` for notices of ``kind`` that arrive (on the thread that
        received them, often the I/O thread: it must not block); ``acknowledge``: tell
        the sender it arrived."""
        self._handlers[kind] = (fn, acknowledge)

    # ------------------------------------------------------------------ sending side
    def post(self, peer, kind, item, ack=None):
        """Queue ``item`` for ``peer``; returns True when the peer had nothing waiting (so
        whoever flushes should look again: its deadline is new)."""
        now = time.monotonic()
        with self._lock:
            box = self._boxes[peer]
            first = box is None
            if first:
                box = self._boxes[peer] = []
                self._posted[peer] = now
                self.next_due = min(self.next_due, now + self.delay)
            if box and box[-1][0] == kind:
                box[-1][1].append(item)
            else:
                box.append([kind, [item]])
            if ack is not None:
                timeout, on_timeout = ack
                self._unacked[(peer, kind, item)] = (now + timeout, on_timeout)
                self.next_due = min(self.next_due, now + timeout)
        return first

    def ride(self, peer, extras):
        """A message's header ``extras`` for ``peer`` with the notices waiting for it added
        (under :data:`EXTRA`); ``extras`` itself is not changed."""
        box = self.take(peer)
        if box is None:
            return extras
        extras = dict(extras) if extras else {}
        extras[EXTRA] = box
        return extras

    def take(self, peer):
        """What waits for ``peer`` (to ride in a message's header), or None."""
        if self._boxes[peer] is None:  # read without the lock: the common, empty case
            return None
        with self._lock:
            box, self._boxes[peer] = self._boxes[peer], None
            self._posted.pop(peer, None)
        return box

    def due(self, now):
        """The I/O thread's tick: ``[(peer, box)]`` that waited ``delay`` seconds (to send on
        their own); notices whose acknowledgement is overdue get their ``on_timeout``."""
        if now < self.next_due:
            return []
        out, overdue = [], []
        with self._lock:
            for peer, since in list(self._posted.items()):
                if now >= since + self.delay:
                    out.append((peer, self._boxes[peer]))
                    self._boxes[peer] = None
                    del self._posted[peer]
            for key, (deadline, on_timeout) in list(self._unacked.items()):
                if now >= deadline:
                    del self._unacked[key]
                    overdue.append((key, on_timeout))
            self.next_due = min([since + self.delay for since in self._posted.values()]
                                + [d for d, _ in self._unacked.values()], default=_FOREVER)
        for (peer, kind, item), on_timeout in overdue:
            try:
                on_timeout(peer, kind, item)
            except Exception:  # noqa: BLE001 - a report must not stop the I/O thread
                log.exception("bookkeeping: reporting an unacknowledged %s failed", kind)
        return out

    def forget_peer(self, peer):
        """``peer`` died or left: nothing waits for it any more, nothing is overdue from it."""
        with self._lock:
            self._boxes[peer] = None
            self._posted.pop(peer, None)
            for key in [k for k in self._unacked if k[0] == peer]:
                del self._unacked[key]

    # ------------------------------------------------------------------ receiving side
    def receive(self, src, box):
        """Hand the notices of a box from ``src`` to their handlers; acknowledge those whose
        kind asks for it. A malformed box raises ValueError (nothing of it is handled)."""
        if type(box) is not list or not all(
                type(run) is list and len(run) == 2 and type(run[0]) is str
                and type(run[1]) is list for run in box):
            raise ValueError(f"malformed bookkeeping from rank {src}")
        if sum(len(run[1]) for run in box) > MAX_ITEMS:
            raise ValueError(f"rank {src} sent more than {MAX_ITEMS} bookkeeping notices in "
                             "one message")
        for kind, items in box:
            if kind == _ACK:
                self._acknowledged(src, items)
                continue
            handler = self._handlers.get(kind)
            if handler is None:
                log.debug("bookkeeping: dropped %d notices of unknown kind %r from rank %d",
                          len(items), kind, src)
                continue
            fn, acknowledge = handler
            fn(src, items)
            if acknowledge:
                for item in items:
                    self.post(src, _ACK, [kind, item])

    def _acknowledged(self, src, items):
        with self._lock:
            for entry in items:
                if type(entry) is list and len(entry) == 2 and type(entry[0]) is str:
                    try:
                        self._unacked.pop((src, entry[0], entry[1]), None)
                    except TypeError:  # an unhashable item cannot be one we wait for
                        pass

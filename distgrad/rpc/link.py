"""A simulated network link between hosts, for measuring on one machine what hosts would see.

These machines have no network between hosts, so a transport can be given a link
model instead (``RpcBackendOptions.simulated_link``, e.g. ``"200us 10Gbit/s"`` or
``"2ms 1Gbit/s"``): every message from another process is held on arrival until it
would have arrived over such a link. Each sender has a link of its own to this
process (a full-duplex point-to-point link, as between two hosts on a switch): a
message occupies it for ``size / bandwidth`` after the previous one from that sender
left it, then takes ``latency`` to arrive. Messages from this process to itself are
not held. Held messages keep their order per sender.

The receiver's I/O thread does the holding (no thread of its own, no sleep in a
sender): :meth:`SimulatedLink.arrival` says when a message is due, the I/O thread
waits until then (``next_due``) and hands it on. Arrays that would travel through
shared memory between processes of one host take the socket instead (the hosts are
apart), so their bytes count.
"""
import heapq
import itertools
import re

__all__ = ["SimulatedLink", "parse_link"]

_UNITS_S = {"s": 1.0, "ms": 1e-3, "us": 1e-6, "µs": 1e-6, "ns": 1e-9}
_UNITS_BPS = {"bit/s": 1, "kbit/s": 1e3, "mbit/s": 1e6, "gbit/s": 1e9, "tbit/s": 1e12,
              "b/s": 8, "kb/s": 8e3, "mb/s": 8e6, "gb/s": 8e9}
_LINK = re.compile(r"^\s*([0-9.]+)\s*([a-zµ]+)\s*[, ]\s*([0-9.]+)\s*([a-z/]+)\s*$", re.I)


def parse_link(text):
    """``"200us 10Gbit/s"`` -> (latency in seconds, bandwidth in bytes per second).

    >>> parse_link("2ms 1Gbit/s")
    (0.002, 125000000.0)
    """
    m = _LINK.match(text or "")
    if not m:
        raise ValueError(f"a simulated link is '<latency> <bandwidth>', such as '200us "
                         f"10Gbit/s' or '2ms 1Gbit/s', not {text!r}")
    latency, lunit, rate, runit = m.groups()
    runit = runit.lower()
    if not runit.endswith("/s"):
        runit += "/s"
    if lunit.lower() not in _UNITS_S or runit not in _UNITS_BPS:
        raise ValueError(f"unknown unit in simulated link {text!r}: latency in s, ms, us or ns; "
                         f"bandwidth in bit/s, kbit/s, Mbit/s, Gbit/s (or bytes: MB/s, GB/s)")
    seconds = float(latency) * _UNITS_S[lunit.lower()]
    bytes_per_s = float(rate) * _UNITS_BPS[runit] / 8
    if seconds < 0 or bytes_per_s <= 0:
        raise ValueError(f"simulated link {text!r}: latency must be >= 0 and bandwidth > 0")
    return seconds, bytes_per_s


class SimulatedLink:
    """When messages from each sender arrive over the link; the messages held until then."""

    def __init__(self, latency, bytes_per_s):
        self.latency, self.bytes_per_s = latency, bytes_per_s
        self._free = {}           # sender -> when its link is free again
        self._held = []           # heap of (due, order, deliver, args)
        self._order = itertools.count()

    def arrival(self, src, nbytes, now):
        """When a message of ``nbytes`` from ``src`` that left now arrives here."""
        start = max(now, self._free.get(src, now))
        self._free[src] = done = start + nbytes / self.bytes_per_s
        return done + self.latency

    def hold(self, due, deliver, *args):
        heapq.heappush(self._held, (due, next(self._order), deliver, args))

    @property
    def next_due(self):
        return self._held[0][0] if self._held else float("inf")

    def release(self, now):
        """Hand on every held message that is due (on the I/O thread)."""
        held = self._held
        while held and held[0][0] <= now:
            _, _, deliver, args = heapq.heappop(held)
            deliver(*args)

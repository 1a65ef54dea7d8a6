"""The distributed autograd context ids a process released recently, so that a late
message of one is ignored instead of making it anew (``container.release_local``).

Remembered for a while, not forever, and compactly: a soak at 170 steps/s releases one
id per step in every process. An ``OrderedDict`` of them (~170 bytes an id, the entry and
its int) held 16 MB once full and levelled off only after ten minutes; kept for two
minutes it still held ~3.5 MB, more the faster the steps. Here the ids of the last few
seconds are a set, and older ones are sorted arrays of 8 bytes an id, one per
:data:`BUCKET` seconds, dropped once older than the time an id is kept: ~0.2 MB at that
rate. Looked up only for a context id this process does not hold (a peer's first
message of a context, or a late one).
"""
import array
import bisect
import collections

__all__ = ["ReleasedIds", "BUCKET"]

BUCKET = 10.0  # seconds of releases gathered in one set before it becomes an array


class ReleasedIds:
    """Ids released at most ``keep_for()`` seconds ago (``keep_for`` is asked at each
    release: the RPC timeout may change), at most ``most`` of them (the oldest go first),
    on the clock ``clock``. Not thread-safe: its owner holds a lock."""

    def __init__(self, keep_for, most, clock):
        self._keep_for, self.most, self._clock = keep_for, most, clock
        self._recent = set()                  # released since _since
        self._since = self._last = None       # first and newest release in _recent
        self._older = collections.deque()     # (newest release in it, sorted array of ids)
        self._older_count = 0

    def __len__(self):
        return len(self._recent) + self._older_count

    def __contains__(self, cid):
        if cid in self._recent:
            return True
        for _, ids in self._older:
            i = bisect.bisect_left(ids, cid)
            if i < len(ids) and ids[i] == cid:
                return True
        return False

    def add(self, cid):
        if type(cid) is not int or not 0 <= cid < 1 << 64:
            return   # names no context of any world (a peer's bad message): none to ignore
        now = self._clock()
        # the set of a bucket's time (or of an eighth of the most, for the bound to bite)
        # becomes an array stamped with its newest release: each id is kept keep_for()
        if self._recent and (now - self._since >= BUCKET
                             or len(self._recent) >= max(1, self.most // 8)):
            self._older.append((self._last, array.array("Q", sorted(self._recent))))
            self._older_count += len(self._recent)
            self._recent = set()
        if not self._recent:
            self._since = now
        self._recent.add(cid)
        self._last = now
        forget_before = now - self._keep_for()
        while self._older and (self._older[0][0] < forget_before or len(self) > self.most):
            self._older_count -= len(self._older.popleft()[1])

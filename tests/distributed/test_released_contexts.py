"""A process remembers the contexts it released for a while (a late message of one is
ignored, not made into a new context), and not forever, in little memory: a long run
stays flat."""
import tracemalloc

from distgrad.distributed.autograd import container
from distgrad.distributed.autograd.released import BUCKET, ReleasedIds


def _ids(keep=120.0, most=100_000):
    clock = [1000.0]
    return ReleasedIds(lambda: keep, most, lambda: clock[0]), clock


def test_released_ids_are_remembered_for_a_while_then_forgotten():
    ids, clock = _ids(keep=30.0)
    for cid in range(1, 6):
        ids.add(cid)
    assert all(cid in ids for cid in range(1, 6)) and 6 not in ids
    clock[0] += BUCKET                       # the first bucket becomes an array
    ids.add(6)
    assert all(cid in ids for cid in range(1, 7)) and 0 not in ids and 7 not in ids
    clock[0] += 19.0                         # 29 s after 1 to 5: kept
    ids.add(7)
    assert 1 in ids and 6 in ids
    clock[0] += 2.0                          # 31 s: forgotten, 6 to 8 are not
    ids.add(8)
    assert [cid for cid in range(1, 9) if cid in ids] == [6, 7, 8] and len(ids) == 3
    ids.add(-1)                              # names no context: nothing to remember
    ids.add(1 << 64)
    assert len(ids) == 3


def test_released_ids_are_bounded_in_number():
    ids, clock = _ids(most=16)
    for cid in range(100):
        ids.add(cid)
    assert len(ids) <= 16 and 99 in ids and 0 not in ids


def test_a_late_message_of_a_released_context_is_ignored(monkeypatch):
    clock = [1000.0]
    ids = ReleasedIds(lambda: 120.0, 100, lambda: clock[0])
    monkeypatch.setattr(container, "_released", ids)
    cid = 3
    container.release_local(cid)
    assert container.admit_context(cid, 0) is None          # a late message: ignored
    clock[0] += 120.0 + 2 * BUCKET
    container.release_local(4)
    container.release_local(5)
    assert cid not in ids                                    # forgotten in time
    ctx = container.admit_context(cid, 0)                    # (a message this late makes it anew)
    assert ctx is not None and ctx.id == cid
    container.release_local(cid)


def test_two_minutes_of_releases_at_170_per_second_take_little_memory():
    ids, clock = _ids()
    first = 1 << 48
    tracemalloc.start()
    try:
        for i in range(170 * 120):
            clock[0] += 1 / 170
            ids.add(first + i)
        held, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert first in ids and first + 170 * 120 - 1 in ids
    assert held < 600_000, held          # an OrderedDict of them held ~3.5 MB

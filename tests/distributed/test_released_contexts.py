"""A process remembers the contexts it released for a while (a late message of one is
ignored, not made into a new context), and not forever: a long run stays flat."""
import collections

from distgrad.distributed.autograd import container


def test_released_ids_are_remembered_for_a_while_then_forgotten(monkeypatch):
    clock = [1000.0]
    monkeypatch.setattr(container, "_clock", lambda: clock[0])
    monkeypatch.setattr(container, "_released", collections.OrderedDict())
    for cid in range(1, 6):
        container.release_local(cid)
    assert container.admit_context(3, 0) is None          # a late message: ignored
    clock[0] += container._RELEASED_FOR + 1
    container.release_local(6)
    assert list(container._released) == [6]              # the old ones are forgotten
    ctx = container.admit_context(3, 0)                   # (a message this late makes it anew)
    assert ctx is not None and ctx.id == 3
    container.release_local(3)


def test_released_ids_are_bounded_in_number(monkeypatch):
    monkeypatch.setattr(container, "_released", collections.OrderedDict())
    monkeypatch.setattr(container, "_RELEASED_KEPT", 3)
    for cid in range(10, 20):
        container.release_local(cid)
    assert list(container._released) == [17, 18, 19]

"""free_port: a port that binds now, away from the ports the kernel hands out for bind(0)."""
import itertools
import socket

from distgrad.utils import ports


def test_the_port_binds_and_lies_outside_the_ephemeral_range():
    lo, hi = ports._ephemeral_range()
    for _ in range(20):
        port = ports.free_port()
        assert not lo <= port <= hi
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))


def test_a_port_in_use_is_never_returned(monkeypatch):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        busy = taken.getsockname()[1]
        # the first five draws hit the busy port, the later ones are random again
        real, calls = ports.random.SystemRandom.randint, itertools.count()
        monkeypatch.setattr(ports, "_ephemeral_range", lambda: (1, 2))
        monkeypatch.setattr(ports.random.SystemRandom, "randint",
                            lambda self, a, b: busy if next(calls) < 5 else real(self, a, b))
        assert ports.free_port() != busy and next(calls) > 5


def test_without_room_outside_the_range_the_kernel_chooses(monkeypatch):
    monkeypatch.setattr(ports, "_ephemeral_range", lambda: (1024, 65535))
    port = ports.free_port()
    assert 1024 <= port <= 65535

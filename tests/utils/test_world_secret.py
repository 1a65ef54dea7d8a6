"""Where a process's world secret comes from and what it hands to the members it starts."""
import pytest

from distgrad.utils import world_secret as ws


@pytest.fixture
def fresh(monkeypatch):
    monkeypatch.delenv(ws.SECRET_ENV, raising=False)
    monkeypatch.setattr(ws, "_made", None)
    monkeypatch.setattr(ws, "_without", False)
    return ws


def test_a_parent_makes_one_secret_and_keeps_it_for_itself(fresh):
    assert fresh.current() is None
    made = fresh.for_children()
    assert len(made) == 64 and fresh.for_children() == made
    assert fresh.current() == made  # a world it joins itself after starting them is theirs


def test_the_environments_secret_is_handed_on(fresh, monkeypatch):
    monkeypatch.setenv(ws.SECRET_ENV, "given")
    assert fresh.for_children() == "given" and fresh.current() == "given"


def test_a_member_of_a_world_without_a_secret_hands_none(fresh):
    fresh.joined_without_secret()  # its children may join that world, which would refuse them
    assert fresh.for_children() is None


@pytest.mark.parametrize("value,required", [("", False), ("0", False), ("no", False),
                                            ("1", True), ("yes", True)])
def test_require_secret_reads_its_variable(monkeypatch, value, required):
    monkeypatch.setenv(ws.REQUIRE_ENV, value)
    assert ws.required() is required

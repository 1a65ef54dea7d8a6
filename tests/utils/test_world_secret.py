"""Where a process's world secret comes from and what it hands to the members it starts."""
import re

import pytest

from distgrad.utils import world_secret as ws


@pytest.fixture
def fresh(monkeypatch):
    monkeypatch.delenv(ws.SECRET_ENV, raising=False)
    monkeypatch.delenv(ws.SECRET_FILE_ENV, raising=False)
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


def test_a_secret_file_only_its_owner_can_read_gives_the_secret(fresh, monkeypatch, tmp_path):
    path = tmp_path / "secret"
    path.write_text("from-a-file\n")
    path.chmod(0o600)
    monkeypatch.setenv(ws.SECRET_FILE_ENV, str(path))
    assert fresh.current() == "from-a-file" and fresh.for_children() == "from-a-file"
    monkeypatch.setenv(ws.SECRET_ENV, "the-variable-wins")
    assert fresh.current() == "the-variable-wins"


@pytest.mark.parametrize("mode,text,error,words", [
    (0o644, "s", PermissionError, "can be read by others (mode 644)"),
    (0o640, "s", PermissionError, "chmod 600"),
    (0o600, "  \n", ValueError, "is empty")])
def test_a_secret_file_others_can_read_or_an_empty_one_is_refused_by_name(
        fresh, monkeypatch, tmp_path, mode, text, error, words):
    path = tmp_path / "secret"
    path.write_text(text)
    path.chmod(mode)
    monkeypatch.setenv(ws.SECRET_FILE_ENV, str(path))
    with pytest.raises(error, match=re.escape(words)) as e:
        fresh.current()
    assert str(path) in str(e.value)


def test_a_missing_secret_file_is_named(fresh, monkeypatch, tmp_path):
    monkeypatch.setenv(ws.SECRET_FILE_ENV, str(tmp_path / "nowhere"))
    with pytest.raises(OSError, match="nowhere: cannot read the world secret"):
        fresh.current()

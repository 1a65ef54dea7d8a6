"""``atomic_write``: readers see the old file or the whole new one; a write that fails
leaves the old file and nothing beside it."""
import pytest

from distgrad.utils.atomic_files import atomic_write


def test_a_failed_write_leaves_the_old_file_and_no_temporary(tmp_path):
    path = tmp_path / "state.bin"
    path.write_bytes(b"old")
    with pytest.raises(RuntimeError, match="disk full"):
        with atomic_write(path) as fh:
            fh.write(b"half of the new")
            raise RuntimeError("disk full")
    assert path.read_bytes() == b"old" and sorted(p.name for p in tmp_path.iterdir()) == [
        "state.bin"]


def test_the_new_file_replaces_the_old_whole_with_or_without_sync(tmp_path):
    path = tmp_path / "state.bin"
    for sync, data in ((True, b"first"), (False, b"second")):
        with atomic_write(path, sync=sync, tag="-w1") as fh:
            fh.write(data)
        assert path.read_bytes() == data
    assert [p.name for p in tmp_path.iterdir()] == ["state.bin"]

"""A value of a type that the called function's module registers with the codec reaches a
worker that has not imported that module yet: the worker imports the target's module (if
it is allowed) and decodes the call again, as unpickling imports a class's module in
PyTorch. A module that is not allowed is refused by name, not as an unknown type."""
import pytest

from distgrad.distributed import rpc
from distgrad.rpc.errors import RefusedCallError

from support import late_records

pytestmark = pytest.mark.timeout(60)


def test_a_type_registered_by_the_targets_module_is_learnt_on_its_first_call(rpc_world):
    rpc_world(1, allowed_modules=["support.late_records"])
    assert rpc.rpc_sync("worker1", late_records.norm2, (late_records.Point(3, 4),)) == 25
    assert rpc.rpc_sync("worker1", late_records.imported_here)


def test_a_type_of_a_module_that_is_not_allowed_is_refused_naming_the_module(
        rpc_world, tmp_path, monkeypatch):
    (tmp_path / "unlisted_records.py").write_text(
        "from distgrad import codec\n"
        "class Box:\n    pass\n"
        "codec.register(Box, 98, lambda b, enc: [], lambda payload, dec: Box())\n"
        "def open_box(box):\n    return 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    import unlisted_records
    rpc_world(1)
    with pytest.raises(RefusedCallError, match="unlisted_records"):
        rpc.rpc_sync("worker1", unlisted_records.open_box, (unlisted_records.Box(),))

"""``torch.serialization``'s safe globals: what a ``weights_only`` load may rebuild."""
import io
import pickle

import pytest

import distgrad
from distgrad import serialization
from distgrad.testing.oracle import torch


class Net(distgrad.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = distgrad.nn.Linear(2, 2)


class Renamed(Net):
    pass


@pytest.fixture(autouse=True)
def no_safe_globals():
    serialization.clear_safe_globals()
    yield
    serialization.clear_safe_globals()


def _saved(obj):
    buf = io.BytesIO()
    distgrad.save(obj, buf)
    return buf.getvalue()


def _load(blob):
    return distgrad.load(io.BytesIO(blob))


def test_safe_globals_allow_a_class_for_the_block_only():
    blob = _saved(Net())
    with pytest.raises(pickle.UnpicklingError, match="add_safe_globals"):
        _load(blob)
    with serialization.safe_globals([Net]):
        assert type(_load(blob)) is Net
        assert serialization.get_safe_globals() == [Net]
    with pytest.raises(pickle.UnpicklingError):
        _load(blob)


def test_add_safe_globals_allows_for_good_and_only_that_class():
    blob, other = _saved(Net()), _saved(Renamed())
    serialization.add_safe_globals([Net])
    serialization.add_safe_globals([Net])  # once is enough
    assert serialization.get_safe_globals() == [Net]
    assert type(_load(blob)) is Net
    with pytest.raises(pickle.UnpicklingError):  # the module is not allowed: only Net
        _load(other)
    serialization.clear_safe_globals()
    with pytest.raises(pickle.UnpicklingError):
        _load(blob)


def test_a_safe_global_under_another_name():
    old = type("OldNet", (Net,), {"__module__": "oldmodels"})  # what the file was saved as
    blob = _saved(old())
    with serialization.safe_globals([(Net, "oldmodels.OldNet")]):
        assert type(_load(blob)) is Net
        assert serialization.get_safe_globals() == [(Net, "oldmodels.OldNet")]
    with pytest.raises(TypeError, match="module.qualname"):
        serialization.add_safe_globals([(Net, "noqualname")])


def test_the_api_is_pytorchs():
    if torch is None:
        pytest.skip("torch is not installed")
    import torch.serialization as theirs
    for name in ("add_safe_globals", "safe_globals", "get_safe_globals", "clear_safe_globals"):
        assert hasattr(theirs, name) and hasattr(serialization, name), name
    # the same idiom works on both: a weights-only load refused, then allowed in the block
    for lib, ser in ((torch, theirs), (distgrad, serialization)):
        class Box(lib.nn.Module):
            def __init__(self):
                super().__init__()
                self.w = lib.nn.Parameter(lib.ones(2))
        Box.__module__, Box.__qualname__ = __name__, "Box"
        globals()["Box"] = Box
        buf = io.BytesIO()
        lib.save(Box(), buf)
        with pytest.raises(pickle.UnpicklingError):
            lib.load(io.BytesIO(buf.getvalue()), weights_only=True)
        allowed = [Box] if lib is distgrad else [Box, torch.nn.Parameter,
                                                   torch._utils._rebuild_parameter]
        with ser.safe_globals(allowed):
            loaded = lib.load(io.BytesIO(buf.getvalue()), weights_only=True)
        assert type(loaded) is Box and loaded.w.tolist() == [1.0, 1.0]

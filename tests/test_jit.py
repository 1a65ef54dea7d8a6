"""``torch.jit`` without TorchScript: script is a pass-through, the rest raises."""
import pytest

import distgrad
from distgrad.distributed.rpc import RRef


def test_script_returns_functions_and_modules_unchanged():
    @distgrad.jit.script
    def add(t1, t2):
        return distgrad.add(t1, t2)

    layer = distgrad.nn.Linear(2, 2)
    assert distgrad.jit.script(layer) is layer
    assert add(distgrad.ones(2), distgrad.ones(2)).tolist() == [2.0, 2.0]
    assert not distgrad.jit.is_scripting() and not distgrad.jit.is_tracing()

    @distgrad.jit.ignore
    def helper():
        return 1

    @distgrad.jit.unused
    def unused():
        return 2

    assert helper() == 1 and unused() == 2 and distgrad.jit.ignore(drop=True)(helper) is helper
    assert not isinstance(layer, distgrad.jit.ScriptModule)


def test_scripted_function_annotated_with_rrefs_loads():
    # As dist_autograd_test.py's my_script_ref_add: the annotations are evaluated.
    @distgrad.jit.script
    def ref_add(ref_t1: RRef[distgrad.Tensor], t2: distgrad.Tensor) -> distgrad.Tensor:
        return ref_t1.to_here() + t2

    assert ref_add.__annotations__["ref_t1"] == RRef[distgrad.Tensor]
    assert RRef[int].__origin__ is RRef


@pytest.mark.parametrize("call", [
    lambda: distgrad.jit.trace(distgrad.nn.Linear(2, 2), distgrad.ones(1, 2)),
    lambda: distgrad.jit.save(distgrad.nn.Linear(2, 2), "model.pt"),
    lambda: distgrad.jit.load("model.pt"),
    lambda: distgrad.jit.ScriptModule(),
])
def test_what_only_torchscript_does_raises(call):
    with pytest.raises(RuntimeError, match="no TorchScript"):
        call()
